#!/usr/bin/env node
// The official TypeScript x402 facilitator (@x402/core x402Facilitator +
// @x402/evm exact scheme), exposed over HTTP for differential tests.
//
// Usage:
//   FACILITATOR_KEY=0x... node official-facilitator.mjs --rpc <url> --chain-id <n> [--port <n>]
//        [--polling-interval-ms <n>] [--confirmation-timeout-ms <n>]
// Each flag may also be given as --flag=value, or through the environment:
//   RPC_URL, CHAIN_ID, PORT (default 0 = ephemeral), POLLING_INTERVAL_MS,
//   CONFIRMATION_TIMEOUT_MS. Flags win over the environment.
// The private key is only read from FACILITATOR_KEY and is never printed.
//
// Once listening on 127.0.0.1, exactly one line is written to stdout:
//   listening http://127.0.0.1:<port>
// Everything else (errors, diagnostics) goes to stderr.
//
// Endpoints:
//   POST /verify, POST /settle  body {paymentPayload, paymentRequirements, ...}
//     200 + facilitator.verify/settle result; 400 {error} if a field is missing;
//     500 {error: message} if the facilitator throws.
//   GET /supported  200 + facilitator.getSupported()

import express from "express";
import { createWalletClient, defineChain, http, publicActions } from "viem";
import { nonceManager, privateKeyToAccount } from "viem/accounts";
import { x402Facilitator } from "@x402/core/facilitator";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { registerExactEvmScheme } from "@x402/evm/exact/facilitator";
import { parseArgs } from "./args.mjs";

function fail(message) {
  process.stderr.write(`official-facilitator: ${message}\n`);
  process.exit(2);
}

function parseNonNegInt(name, value) {
  if (!/^\d+$/.test(String(value))) {
    fail(`${name} must be a non-negative integer, got ${JSON.stringify(value)}`);
  }
  return Number(value);
}

let args;
try {
  args = parseArgs(process.argv.slice(2));
} catch (err) {
  fail(err.message);
}
const known = new Set(["rpc", "chain-id", "port", "polling-interval-ms", "confirmation-timeout-ms"]);
for (const key of Object.keys(args)) {
  if (!known.has(key)) fail(`unknown flag --${key}`);
}

const rpcUrl = args["rpc"] ?? process.env.RPC_URL;
const chainIdRaw = args["chain-id"] ?? process.env.CHAIN_ID;
const portRaw = args["port"] ?? process.env.PORT ?? "0";
const pollingRaw = args["polling-interval-ms"] ?? process.env.POLLING_INTERVAL_MS;
const confirmRaw = args["confirmation-timeout-ms"] ?? process.env.CONFIRMATION_TIMEOUT_MS;
const privateKey = process.env.FACILITATOR_KEY;

if (!rpcUrl) fail("missing --rpc (or RPC_URL)");
if (chainIdRaw === undefined) fail("missing --chain-id (or CHAIN_ID)");
if (!privateKey) fail("missing FACILITATOR_KEY in the environment");
if (!/^0x[0-9a-fA-F]{64}$/.test(privateKey)) fail("FACILITATOR_KEY must be 0x + 64 hex digits");

const chainId = parseNonNegInt("--chain-id", chainIdRaw);
const port = parseNonNegInt("--port", portRaw);
const pollingInterval = pollingRaw === undefined ? undefined : parseNonNegInt("--polling-interval-ms", pollingRaw);
const confirmationTimeoutMs = confirmRaw === undefined ? undefined : parseNonNegInt("--confirmation-timeout-ms", confirmRaw);

const chain = defineChain({
  id: chainId,
  name: `chain-${chainId}`,
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpcUrl] } },
});

// viem's nonceManager hands out relayer nonces locally, so concurrent settles
// do not reuse the same nonce.
const account = privateKeyToAccount(privateKey, { nonceManager });
const walletClient = createWalletClient({
  account,
  chain,
  transport: http(rpcUrl),
  ...(pollingInterval !== undefined && { pollingInterval }),
}).extend(publicActions);

const signer = toFacilitatorEvmSigner(
  { ...walletClient, address: account.address },
  confirmationTimeoutMs !== undefined ? { confirmationTimeoutMs } : undefined,
);

const facilitator = new x402Facilitator();
// Registers v2 for eip155:<chainId> and v1 for every name in @x402/evm's v1
// network table (e.g. base-sepolia = 84532).
registerExactEvmScheme(facilitator, { signer, networks: [`eip155:${chainId}`] });

const app = express();
app.use(express.json({ limit: "1mb" }));

function handler(method) {
  return async (req, res) => {
    const body = req.body;
    const paymentPayload = body?.paymentPayload;
    const paymentRequirements = body?.paymentRequirements;
    if (!paymentPayload || !paymentRequirements) {
      res.status(400).json({ error: "Missing paymentPayload or paymentRequirements" });
      return;
    }
    try {
      const result = await facilitator[method](paymentPayload, paymentRequirements);
      res.json(result);
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      process.stderr.write(`official-facilitator: ${method} threw: ${message}\n`);
      res.status(500).json({ error: message });
    }
  };
}

app.post("/verify", handler("verify"));
app.post("/settle", handler("settle"));
app.get("/supported", (_req, res) => {
  try {
    res.json(facilitator.getSupported());
  } catch (err) {
    res.status(500).json({ error: err instanceof Error ? err.message : String(err) });
  }
});

// Malformed JSON and other middleware errors: answer JSON, not express's HTML page.
app.use((err, _req, res, _next) => {
  const status = err?.status ?? err?.statusCode ?? 500;
  res.status(status).json({ error: err?.message ?? String(err) });
});

const server = app.listen(port, "127.0.0.1", (err) => {
  if (err) fail(`listen failed: ${err.message}`);
  const address = server.address();
  process.stdout.write(`listening http://127.0.0.1:${address.port}\n`);
});
server.on("error", (err) => fail(`server error: ${err.message}`));

let shuttingDown = false;
function shutdown() {
  if (shuttingDown) return;
  shuttingDown = true;
  server.close(() => process.exit(0));
  server.closeAllConnections?.();
  // Do not hang on in-flight settles (receipt waits) after a signal.
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);
