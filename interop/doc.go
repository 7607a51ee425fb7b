// Package interop holds the tests that hold this facilitator to the official x402 packages:
// payloads signed by the official client (@x402/evm, driven by js/sign.mjs) are sent both to our
// /verify and to the official facilitator (@x402/core + @x402/evm, js/official-facilitator.mjs)
// running on the same anvil, and the answers must agree except where README.md documents a
// deliberate difference.
package interop
