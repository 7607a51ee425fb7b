#!/usr/bin/env node
// A paying client built only from the official packages (@x402/fetch wrapFetchWithPayment over an
// x402Client with the exact-EVM client scheme) that attaches a payment identifier the documented
// way, for the "lost response" interop test.
//
// Usage:
//   PAYER_KEY=0x... node agent.mjs --url <merchant url of the paid resource> --id <payment id>
//        [--asset <addr> --network eip155:<n>]   (adds the asset to the spend controls' allow-list;
//                                                  without them spend controls are off)
// Each flag may also be --flag=value. The key is only read from PAYER_KEY and never printed.
//
// What it does:
//  1. GET <url> through wrapFetchWithPayment(fetch, client), where
//     client.onBeforePaymentCreation appends the id with appendPaymentIdentifierToExtensions.
//     The inner fetch records the request headers of the paid attempt (PAYMENT-SIGNATURE). This
//     attempt is expected to fail with a network error: the merchant drops the response.
//  2. Retries the same request with plain fetch and the SAME recorded PAYMENT-SIGNATURE header:
//     the same id and the same signed payload (the wrapped fetch would sign a fresh authorization).
// Prints one JSON line on stdout:
//   {"firstError": "<message or null>", "firstStatus": <status or null>,
//    "status": <retry status>, "content": <retry JSON body or text>,
//    "paymentResponse": <decoded PAYMENT-RESPONSE of the retry or null>,
//    "paymentId": "<id inside the sent payload>", "paymentSignature": "<the header sent twice>"}
// Exits 1 with a message on stderr if it cannot get that far (no paid attempt was made, ...).

import { decodePaymentResponseHeader, wrapFetchWithPayment } from "@x402/fetch";
import { PAYMENT_IDENTIFIER, appendPaymentIdentifierToExtensions } from "@x402/extensions/payment-identifier";
import { parseArgs } from "./args.mjs";
import { readContent } from "./content.mjs";
import { exactEvmClient } from "./v2client.mjs";

function errorText(err) {
  if (!(err instanceof Error)) return String(err);
  return err.cause instanceof Error ? `${err.message}: ${err.cause.message}` : err.message;
}

async function main() {
  const args = parseArgs(process.argv.slice(2), ["url", "id"]);
  const key = process.env.PAYER_KEY;
  if (!key) throw new Error("PAYER_KEY is not set");

  const client = exactEvmClient(key, args);
  client.onBeforePaymentCreation(async ({ paymentRequired }) => {
    if (!paymentRequired.extensions?.[PAYMENT_IDENTIFIER]) {
      throw new Error("the merchant did not declare the payment-identifier extension");
    }
    appendPaymentIdentifierToExtensions(paymentRequired.extensions, args.id);
  });

  // The inner fetch: records what the wrapped fetch sends with a payment.
  let paymentSignature = null;
  const recordingFetch = async (input, init) => {
    const req = input instanceof Request ? input : new Request(input, init);
    const sig = req.headers.get("payment-signature");
    if (sig) paymentSignature = sig;
    return fetch(req);
  };
  const payingFetch = wrapFetchWithPayment(recordingFetch, client);

  const summary = { firstError: null, firstStatus: null };
  try {
    const res = await payingFetch(args.url, { method: "GET" });
    summary.firstStatus = res.status;
    await res.arrayBuffer().catch(() => {});
  } catch (err) {
    summary.firstError = errorText(err);
  }
  if (!paymentSignature) throw new Error(`no paid attempt was made (first attempt: ${JSON.stringify(summary)})`);

  const payload = JSON.parse(Buffer.from(paymentSignature, "base64").toString("utf8"));
  summary.paymentId = payload.extensions?.[PAYMENT_IDENTIFIER]?.info?.id ?? null;

  // The retry: same request, same id, same signed payload.
  const retry = await fetch(args.url, { method: "GET", headers: { "PAYMENT-SIGNATURE": paymentSignature } });
  summary.status = retry.status;
  summary.content = await readContent(retry);
  const header = retry.headers.get("payment-response");
  summary.paymentResponse = header ? decodePaymentResponseHeader(header) : null;
  summary.paymentSignature = paymentSignature;
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((err) => {
  process.stderr.write(`agent: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
