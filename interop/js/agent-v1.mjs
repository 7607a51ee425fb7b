#!/usr/bin/env node
// A v1 paying client built only from the official v1 package x402-fetch 1.2.0:
// wrapFetchWithPayment(fetch, walletClient) with a viem wallet client whose chain is the local anvil
// under the chain id of a network the v1 packages know (base-sepolia = 84532 by default). It pays for
// one resource, once.
//
// Usage:
//   PAYER_KEY=0x... node agent-v1.mjs --url <paid resource> --rpc <anvil url> [--chain-id 84532]
//        [--max-value <atomic units>]   (x402-fetch's own cap; its default is 0.10 USDC)
// Each flag may also be --flag=value. The key is only read from PAYER_KEY and never printed.
//
// Prints one JSON line on stdout:
//   {"status": <final status>, "content": <JSON body or text>,
//    "paymentResponse": <decoded X-PAYMENT-RESPONSE or null>,
//    "payment": <decoded X-PAYMENT the client sent, or null>, "requests": <fetches made>}
// Exits 1 with a message on stderr if the wrapped fetch throws.

import { createWalletClient, defineChain, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { baseSepolia } from "viem/chains";
import { decodeXPaymentResponse, wrapFetchWithPayment } from "x402-fetch";
import { parseArgs } from "./args.mjs";
import { readContent } from "./content.mjs";

function headerValue(headers, name) {
  if (!headers) return null;
  if (headers instanceof Headers) return headers.get(name);
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name.toLowerCase()) return v;
  }
  return null;
}

async function main() {
  const args = parseArgs(process.argv.slice(2), ["url", "rpc"]);
  const key = process.env.PAYER_KEY;
  if (!key) throw new Error("PAYER_KEY is not set");
  const chainId = Number(args["chain-id"] ?? "84532");

  // Base Sepolia's chain object, pointed at the local anvil (which runs under its id).
  const chain = defineChain({
    ...baseSepolia,
    id: chainId,
    rpcUrls: { default: { http: [args.rpc] } },
  });
  const walletClient = createWalletClient({ account: privateKeyToAccount(key), chain, transport: http(args.rpc) });

  // The inner fetch records what the wrapped fetch sends.
  let paymentHeader = null;
  let requests = 0;
  const recordingFetch = async (input, init) => {
    requests++;
    const h = headerValue(init?.headers, "X-PAYMENT");
    if (h) paymentHeader = h;
    return fetch(input, init);
  };
  const payingFetch =
    args["max-value"] !== undefined
      ? wrapFetchWithPayment(recordingFetch, walletClient, BigInt(args["max-value"]))
      : wrapFetchWithPayment(recordingFetch, walletClient);

  const res = await payingFetch(args.url, { method: "GET" });
  const content = await readContent(res);
  const header = res.headers.get("x-payment-response");
  const summary = {
    status: res.status,
    content,
    paymentResponse: header ? decodeXPaymentResponse(header) : null,
    payment: paymentHeader ? JSON.parse(Buffer.from(paymentHeader, "base64").toString("utf8")) : null,
    requests,
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((err) => {
  process.stderr.write(`agent-v1: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
