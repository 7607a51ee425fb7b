#!/usr/bin/env node
// A merchant built only from the official packages (@x402/express's paymentMiddleware over an
// x402ResourceServer and the official HTTPFacilitatorClient), under a facilitator that requires
// API keys, which records with the facilitator what it delivered for each settled payment: the
// SHA-256 of the response body it served (POST /v1/settlements/{tx}/delivery). The README's
// snippet for @x402/express merchants is this file's hook.
//
// How: the middleware buffers the route's response until the payment is settled, and hands the
// buffered body to the resource server's settle hooks as transportContext.responseBody (with
// transportContext.responseHeaders); onAfterSettle runs only for a successful settlement, whose
// result.transaction is the hash to record under. The hook does not wait for the record: the
// client's response is held until every hook has returned.
//
// Usage:
//   FACILITATOR_API_KEY=x402_... node merchant-delivery.mjs --facilitator <url> --chain-id <n> \
//        --asset <addr> --pay-to <addr> [--port 0] [--amount 10000] [--token-name "USD Coin"] [--token-version 2]
// The key (verify and settle scopes) is only read from the environment and never printed.
//
// Route: GET /paid, priced `amount` atomic units of `asset` on eip155:<chain-id>, paid to
// `pay-to`. The handler answers 200 {"content": "secret", "serial": <random>}: a body of its own
// per request, so a record can only match the response it was made for.
//
// Once it listens on 127.0.0.1, exactly one line is written to stdout:
//   listening http://127.0.0.1:<port>
// Diagnostics go to stderr: a record the facilitator did not take is logged there.

import { createHash, randomUUID } from "node:crypto";
import http from "node:http";
import express from "express";
import { HTTPFacilitatorClient, x402ResourceServer } from "@x402/core/server";
import { ExactEvmScheme } from "@x402/evm/exact/server";
import { paymentMiddleware } from "@x402/express";
import { parseArgs } from "./args.mjs";

function fail(message) {
  process.stderr.write(`merchant: ${message}\n`);
  process.exit(2);
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2), ["facilitator", "chain-id", "asset", "pay-to"]);
  } catch (err) {
    fail(err.message);
  }
  const apiKey = process.env.FACILITATOR_API_KEY;
  if (!apiKey) fail("FACILITATOR_API_KEY is not set");
  if (!/^\d+$/.test(args["chain-id"])) fail(`--chain-id must be a number, got ${JSON.stringify(args["chain-id"])}`);
  const amount = args.amount ?? "10000";
  const network = `eip155:${args["chain-id"]}`;
  const facilitatorURL = args.facilitator.replace(/\/+$/, "");

  // --- the README's snippet starts here ---
  const auth = { Authorization: `Bearer ${process.env.FACILITATOR_API_KEY}` };
  const facilitator = new HTTPFacilitatorClient({
    url: facilitatorURL,
    createAuthHeaders: async () => ({ verify: auth, settle: auth, supported: auth }),
  });
  const server = new x402ResourceServer(facilitator).register(network, new ExactEvmScheme());

  // After a settlement succeeded, record the SHA-256 of the response served for it.
  server.onAfterSettle(async ({ paymentPayload, requirements, result, transportContext }) => {
    const body = transportContext?.responseBody;
    if (!body || !result.transaction) return;
    const { from, nonce } = paymentPayload.payload.authorization;
    const record = {
      sha256: "0x" + createHash("sha256").update(body).digest("hex"),
      contentType: transportContext.responseHeaders?.["content-type"],
      size: body.length,
      // Names the payment among a batch transaction's.
      authorization: { network: requirements.network, asset: requirements.asset, from, nonce },
    };
    // Not awaited: the client's response waits for this hook to return.
    fetch(`${facilitatorURL}/v1/settlements/${result.transaction}/delivery`, {
      method: "POST",
      headers: { ...auth, "Content-Type": "application/json" },
      body: JSON.stringify(record),
    }).catch((err) => console.error("delivery record", err));
  });
  // --- the README's snippet ends here ---

  const routes = {
    "GET /paid": {
      accepts: [
        {
          scheme: "exact",
          network,
          payTo: args["pay-to"],
          price: {
            amount,
            asset: args.asset,
            extra: { name: args["token-name"] ?? "USD Coin", version: args["token-version"] ?? "2" },
          },
          maxTimeoutSeconds: 60,
        },
      ],
      description: "a paid secret",
      mimeType: "application/json",
    },
  };
  const app = express();
  app.use(paymentMiddleware(routes, server));
  app.get("/paid", (_req, res) => {
    res.json({ content: "secret", serial: randomUUID() });
  });
  const appServer = http.createServer(app);
  const port = await new Promise((resolve, reject) => {
    appServer.once("error", reject);
    appServer.listen(Number(args.port ?? "0"), "127.0.0.1", () => resolve(appServer.address().port));
  });
  const stop = () => {
    appServer.close();
    appServer.closeAllConnections?.();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  process.stdout.write(`listening http://127.0.0.1:${port}\n`);
}

main().catch((err) => fail(err instanceof Error ? (err.stack ?? err.message) : String(err)));
