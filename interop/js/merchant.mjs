#!/usr/bin/env node
// A merchant built only from the official packages: an express 5 app with @x402/express's
// paymentMiddleware, an x402ResourceServer talking to a facilitator through the official
// HTTPFacilitatorClient, the exact-EVM server scheme, and one paid route that declares the
// payment-identifier extension (@x402/extensions/payment-identifier). For the "lost response"
// interop test.
//
// Usage:
//   node merchant.mjs --facilitator <url> --chain-id <n> --asset <addr> --pay-to <addr>
//        [--port 0] [--amount 10000] [--token-name "USD Coin"] [--token-version 2]
// Each flag may also be --flag=value. DROP_FIRST_PAID=1 in the environment turns on the drop
// (below).
//
// Route: GET /paid, priced `amount` atomic units of `asset` on eip155:<chain-id>, paid to
// `pay-to`, extensions {"payment-identifier": declarePaymentIdentifierExtension(false)}.
// The handler answers 200 {"content": "secret"}.
//
// The lost response: the express app listens on an internal port; clients talk to a small
// HTTP proxy in this process, which forwards every request to it. With DROP_FIRST_PAID=1 the
// FIRST request carrying a PAYMENT-SIGNATURE header is forwarded as usual, the proxy reads the
// merchant's whole response (so the middleware has verified, served and settled it), and then
// destroys the client's socket without writing a byte: the paid response is lost on the way to
// the client, after the merchant was paid.
//
// Once both listen on 127.0.0.1, exactly one line is written to stdout:
//   listening http://127.0.0.1:<proxy port>
// Diagnostics go to stderr: one "merchant: ..." line per proxied request (method, path,
// whether it carried a payment, the merchant's status, and whether it was dropped).

import http from "node:http";
import express from "express";
import { HTTPFacilitatorClient, x402ResourceServer } from "@x402/core/server";
import { ExactEvmScheme } from "@x402/evm/exact/server";
import { paymentMiddleware } from "@x402/express";
import { PAYMENT_IDENTIFIER, declarePaymentIdentifierExtension } from "@x402/extensions/payment-identifier";
import { parseArgs } from "./args.mjs";

function fail(message) {
  process.stderr.write(`merchant: ${message}\n`);
  process.exit(2);
}

function log(message) {
  process.stderr.write(`merchant: ${message}\n`);
}

function listen(server, port) {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => resolve(server.address().port));
  });
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2), ["facilitator", "chain-id", "asset", "pay-to"]);
  } catch (err) {
    fail(err.message);
  }
  if (!/^\d+$/.test(args["chain-id"])) fail(`--chain-id must be a number, got ${JSON.stringify(args["chain-id"])}`);
  const amount = args.amount ?? "10000";
  if (!/^\d+$/.test(amount)) fail(`--amount must be atomic units, got ${JSON.stringify(amount)}`);
  const port = Number(args.port ?? "0");
  const network = `eip155:${args["chain-id"]}`;
  const dropFirstPaid = process.env.DROP_FIRST_PAID === "1";

  const server = new x402ResourceServer(new HTTPFacilitatorClient({ url: args.facilitator })).register(
    network,
    new ExactEvmScheme(),
  );
  const routes = {
    "GET /paid": {
      accepts: [
        {
          scheme: "exact",
          network,
          payTo: args["pay-to"],
          // An explicit AssetAmount: our chain's USDC is not a default asset of the scheme.
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
      extensions: { [PAYMENT_IDENTIFIER]: declarePaymentIdentifierExtension(false) },
    },
  };

  const app = express();
  app.use(paymentMiddleware(routes, server));
  app.get("/paid", (_req, res) => {
    res.json({ content: "secret" });
  });
  const appServer = http.createServer(app);
  const appPort = await listen(appServer, 0);

  // The client-facing proxy.
  let dropped = false;
  const proxy = http.createServer((req, res) => {
    const paid = req.headers["payment-signature"] !== undefined;
    const drop = dropFirstPaid && paid && !dropped;
    if (drop) dropped = true;
    const upstream = http.request(
      { host: "127.0.0.1", port: appPort, method: req.method, path: req.url, headers: req.headers },
      (up) => {
        const chunks = [];
        up.on("data", (c) => chunks.push(c));
        up.on("end", () => {
          const body = Buffer.concat(chunks);
          log(
            `${req.method} ${req.url} payment=${paid ? "yes" : "no"} -> ${up.statusCode}` +
              `${up.headers["payment-response"] ? " with PAYMENT-RESPONSE" : ""}${drop ? " DROPPED" : ""}`,
          );
          if (drop) {
            // The merchant has settled and answered; the client never hears of it.
            req.socket.destroy();
            return;
          }
          const headers = { ...up.headers };
          delete headers["transfer-encoding"];
          headers["content-length"] = String(body.length);
          res.writeHead(up.statusCode, headers);
          res.end(body);
        });
        up.on("error", (err) => {
          log(`upstream response error: ${err.message}`);
          req.socket.destroy();
        });
      },
    );
    upstream.on("error", (err) => {
      log(`upstream error: ${err.message}`);
      if (!res.headersSent) {
        res.writeHead(502, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: "upstream failed" }));
      } else {
        req.socket.destroy();
      }
    });
    req.pipe(upstream);
  });
  const proxyPort = await listen(proxy, port);

  const stop = () => {
    proxy.close();
    appServer.close();
    proxy.closeAllConnections?.();
    appServer.closeAllConnections?.();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  process.stdout.write(`listening http://127.0.0.1:${proxyPort}\n`);
}

main().catch((err) => fail(err instanceof Error ? err.stack ?? err.message : String(err)));
