#!/usr/bin/env node
// Signs x402 payment payloads with the official client (@x402/core x402Client +
// @x402/evm exact client schemes), for differential tests.
//
// stdin: one JSON document
//   {"cases": [{
//      "name": "...",                       // echoed back
//      "version": 2 | 1,                    // default 2
//      "key": "0x<32-byte private key>",    // payer
//      "requirements": {...},               // v2 or v1 PaymentRequirements
//      "resource": {...},                   // optional, v2 only: PaymentRequired.resource
//                                           //   (default {"url": "http://merchant.test/paid"})
//      "extensions": {...} | null,          // optional, v2 only: PaymentRequired.extensions
//                                           //   (default {}; null = no extensions key at all)
//      "now": 1700000000,                   // optional unix seconds used instead of the clock
//      "authorizationOverrides": {...},     // optional: fields replacing the client's authorization
//                                           //   values, re-signed with a valid EIP-712 signature
//      "domainOverrides": {...}             // optional (only with re-signing): replaces fields of the
//                                           //   EIP-712 domain {name, version, chainId, verifyingContract}
//   }]}
// stdout: {"payloads": [{"name": "...", "paymentPayload": {...}}]}  (same order as the cases)
// On any error: message on stderr (naming the case), exit status 1, nothing on stdout.
//
// The payload is created by x402Client.createPaymentPayload(paymentRequired) with
// registerExactEvmScheme(client, {signer: toClientEvmSigner(account)}), from the
// PaymentRequired {x402Version: 2, resource, accepts: [requirements], extensions}
// (v2) or {x402Version: 1, accepts: [requirements]} (v1). Spend controls are
// disabled (setSpendControls(false)) so that any asset and amount can be signed.

import { getAddress } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { x402Client } from "@x402/core/client";
import { authorizationTypes, toClientEvmSigner } from "@x402/evm";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { getEvmChainIdV1 } from "@x402/evm/v1";

const DEFAULT_RESOURCE = { url: "http://merchant.test/paid" };

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

function chainIdFor(version, network) {
  if (version === 1) return getEvmChainIdV1(network);
  const m = /^eip155:(\d+)$/.exec(network);
  if (!m) throw new Error(`not an eip155:<id> network: ${JSON.stringify(network)}`);
  return Number(m[1]);
}

// Runs fn with Date.now() pinned to `now` (unix seconds). This process only
// signs, one case at a time, so nothing else observes the patched clock.
async function withClock(now, fn) {
  if (now === undefined || now === null) return fn();
  if (!Number.isInteger(now) || now < 0) throw new Error(`now must be a non-negative integer, got ${JSON.stringify(now)}`);
  const realNow = Date.now;
  Date.now = () => now * 1000;
  try {
    return await fn();
  } finally {
    Date.now = realNow;
  }
}

async function signCase(c) {
  const version = c.version ?? 2;
  if (version !== 1 && version !== 2) throw new Error(`version must be 1 or 2, got ${JSON.stringify(version)}`);
  if (typeof c.key !== "string") throw new Error("key missing");
  if (!c.requirements || typeof c.requirements !== "object") throw new Error("requirements missing");

  const account = privateKeyToAccount(c.key);
  const client = new x402Client();
  registerExactEvmScheme(client, { signer: toClientEvmSigner(account) });
  client.setSpendControls(false);

  let paymentRequired;
  if (version === 2) {
    paymentRequired = {
      x402Version: 2,
      resource: c.resource ?? DEFAULT_RESOURCE,
      accepts: [c.requirements],
    };
    const extensions = c.extensions === undefined ? {} : c.extensions;
    if (extensions !== null) paymentRequired.extensions = extensions;
  } else {
    paymentRequired = { x402Version: 1, accepts: [c.requirements] };
  }

  const paymentPayload = await withClock(c.now, () => client.createPaymentPayload(paymentRequired));

  const overrides = c.authorizationOverrides;
  const domainOverrides = c.domainOverrides;
  if ((overrides && Object.keys(overrides).length > 0) || (domainOverrides && Object.keys(domainOverrides).length > 0)) {
    const req = c.requirements;
    if (!req.extra?.name || !req.extra?.version) throw new Error("requirements.extra.name/version required to re-sign");
    // Same key order as the client's authorization; overridden keys keep their position.
    const authorization = { ...paymentPayload.payload.authorization, ...(overrides ?? {}) };
    for (const [k, v] of Object.entries(authorization)) {
      if (typeof v !== "string") throw new Error(`authorization.${k} must be a string, got ${JSON.stringify(v)}`);
    }
    const domain = {
      name: req.extra.name,
      version: req.extra.version,
      chainId: chainIdFor(version, req.network),
      verifyingContract: getAddress(req.asset),
      ...(domainOverrides ?? {}),
    };
    const signature = await account.signTypedData({
      domain,
      types: authorizationTypes,
      primaryType: "TransferWithAuthorization",
      message: {
        from: getAddress(authorization.from),
        to: getAddress(authorization.to),
        value: BigInt(authorization.value),
        validAfter: BigInt(authorization.validAfter),
        validBefore: BigInt(authorization.validBefore),
        nonce: authorization.nonce,
      },
    });
    paymentPayload.payload = { ...paymentPayload.payload, authorization, signature };
  }

  return paymentPayload;
}

async function main() {
  const input = JSON.parse(await readStdin());
  if (!input || !Array.isArray(input.cases)) throw new Error('stdin must be {"cases": [...]}');
  const payloads = [];
  for (const [i, c] of input.cases.entries()) {
    try {
      payloads.push({ name: c.name, paymentPayload: await signCase(c) });
    } catch (err) {
      throw new Error(`case ${i} (${JSON.stringify(c?.name)}): ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  process.stdout.write(JSON.stringify({ payloads }) + "\n");
}

main().catch((err) => {
  process.stderr.write(`sign: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
