#!/usr/bin/env node
// A v1 merchant built only from the official v1 packages: an express app with x402-express 1.2.0's
// paymentMiddleware(payTo, routes, facilitator), which talks to the facilitator through x402 1.2.0's
// useFacilitator. The express is the one x402-express itself depends on (4.x), resolved from its
// package, so the middleware runs on the framework it was written for.
//
// Usage:
//   node merchant-v1.mjs --facilitator <url> --asset <addr> --pay-to <addr>
//        [--network base-sepolia] [--port 0] [--amount 10000] [--decimals 6]
//        [--token-name "USD Coin"] [--token-version 2]
// Each flag may also be --flag=value.
//
// Route: GET /paid, priced with an explicit ERC20TokenAmount (our chain's USDC is not the package's
// default asset for the network): {amount, asset: {address, decimals, eip712: {name, version}}}.
// The handler answers 200 {"content": "secret"}.
//
// Once listening on 127.0.0.1, exactly one line is written to stdout:
//   listening http://127.0.0.1:<port>
// Diagnostics go to stderr: one "merchant-v1: ..." line per request (method, path, whether it
// carried X-PAYMENT, the status, and whether X-PAYMENT-RESPONSE was set).

import { createRequire } from "node:module";
import { paymentMiddleware } from "x402-express";
import { parseArgs } from "./args.mjs";

const express = createRequire(import.meta.resolve("x402-express"))("express");

function fail(message) {
  process.stderr.write(`merchant-v1: ${message}\n`);
  process.exit(2);
}

function log(message) {
  process.stderr.write(`merchant-v1: ${message}\n`);
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2), ["facilitator", "asset", "pay-to"]);
  } catch (err) {
    fail(err.message);
  }
  const amount = args.amount ?? "10000";
  if (!/^\d+$/.test(amount)) fail(`--amount must be atomic units, got ${JSON.stringify(amount)}`);
  const network = args.network ?? "base-sepolia";
  const port = Number(args.port ?? "0");

  const routes = {
    "GET /paid": {
      price: {
        amount,
        asset: {
          address: args.asset,
          decimals: Number(args.decimals ?? "6"),
          eip712: { name: args["token-name"] ?? "USD Coin", version: args["token-version"] ?? "2" },
        },
      },
      network,
      config: { description: "a paid secret", mimeType: "application/json", maxTimeoutSeconds: 60 },
    },
  };

  const app = express();
  app.use((req, res, next) => {
    res.on("finish", () => {
      log(
        `${req.method} ${req.url} payment=${req.header("X-PAYMENT") ? "yes" : "no"} -> ${res.statusCode}` +
          `${res.getHeader("X-PAYMENT-RESPONSE") ? " with X-PAYMENT-RESPONSE" : ""}`,
      );
    });
    next();
  });
  app.use(paymentMiddleware(args["pay-to"], routes, { url: args.facilitator }));
  app.get("/paid", (_req, res) => {
    res.json({ content: "secret" });
  });

  const server = await new Promise((resolve, reject) => {
    const s = app.listen(port, "127.0.0.1", () => resolve(s));
    s.once("error", reject);
  });
  const stop = () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  process.stdout.write(`listening http://127.0.0.1:${server.address().port}\n`);
}

main().catch((err) => fail(err instanceof Error ? (err.stack ?? err.message) : String(err)));
