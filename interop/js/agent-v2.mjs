#!/usr/bin/env node
// A paying client built only from the official v2 packages: @x402/fetch's wrapFetchWithPayment over
// an x402Client with the exact-EVM client scheme (@x402/evm). It pays for one resource, once.
//
// Usage:
//   PAYER_KEY=0x... node agent-v2.mjs --url <paid resource> [--asset <addr> --network eip155:<n>]
// --asset and --network add that asset to the client's spend controls (by default the client refuses
// assets it does not know); without them spend controls are off. Each flag may also be --flag=value.
// The key is only read from PAYER_KEY and never printed.
//
// Prints one JSON line on stdout:
//   {"status": <final status>, "content": <JSON body or text>,
//    "paymentResponse": <decoded PAYMENT-RESPONSE or null>,
//    "paymentPayload": <decoded PAYMENT-SIGNATURE the client sent, or null>, "requests": <fetches made>,
//    "bodySha256": <0x-prefixed SHA-256 of the final body's bytes as received>}
// Exits 1 with a message on stderr if the wrapped fetch throws.

import { decodePaymentResponseHeader, wrapFetchWithPayment } from "@x402/fetch";
import { parseArgs } from "./args.mjs";
import { readBody } from "./content.mjs";
import { exactEvmClient } from "./v2client.mjs";

async function main() {
  const args = parseArgs(process.argv.slice(2), ["url"]);
  const key = process.env.PAYER_KEY;
  if (!key) throw new Error("PAYER_KEY is not set");

  const client = exactEvmClient(key, args);

  // The inner fetch records what the wrapped fetch sends.
  let paymentSignature = null;
  let requests = 0;
  const recordingFetch = async (input, init) => {
    const req = input instanceof Request ? input : new Request(input, init);
    requests++;
    const sig = req.headers.get("payment-signature");
    if (sig) paymentSignature = sig;
    return fetch(req);
  };
  const payingFetch = wrapFetchWithPayment(recordingFetch, client);

  const res = await payingFetch(args.url, { method: "GET" });
  const { content, sha256: bodySha256 } = await readBody(res);
  const header = res.headers.get("payment-response");
  const summary = {
    status: res.status,
    content,
    paymentResponse: header ? decodePaymentResponseHeader(header) : null,
    paymentPayload: paymentSignature ? JSON.parse(Buffer.from(paymentSignature, "base64").toString("utf8")) : null,
    requests,
    bodySha256,
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((err) => {
  process.stderr.write(`agent-v2: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
