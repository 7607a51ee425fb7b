// How the agents read the answer they paid for; it imports only node's own modules, so that each
// agent still loads only its own version's official packages.

import { createHash } from "node:crypto";

// readContent is res's body as JSON, or as text when it is not JSON (an error page, a plain answer).
export async function readContent(res) {
  return (await readBody(res)).content;
}

// readBody is res's body as readContent reads it, and the SHA-256 of its bytes as received
// (0x-prefixed hex): what a merchant's delivery record must match.
export async function readBody(res) {
  const raw = Buffer.from(await res.arrayBuffer());
  const sha256 = "0x" + createHash("sha256").update(raw).digest("hex");
  const text = raw.toString("utf8");
  try {
    return { content: JSON.parse(text), sha256 };
  } catch {
    return { content: text, sha256 };
  }
}
