// How the agents read the answer they paid for; it imports nothing, so that each agent still loads
// only its own version's official packages.

// readContent is res's body as JSON, or as text when it is not JSON (an error page, a plain answer).
export async function readContent(res) {
  const text = await res.text();
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
