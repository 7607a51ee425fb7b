// Package interop holds the tests that hold this facilitator to the official x402 packages, on
// anvil with Circle's USDC:
//
//   - differential /verify: payloads signed by the official client (@x402/evm, js/sign.mjs) go both
//     to our /verify and to the official facilitator (@x402/core + @x402/evm,
//     js/official-facilitator.mjs); the answers must agree except where docs/api.md documents a
//     deliberate difference;
//   - merchants and clients: @x402/express with @x402/fetch (v2) and x402-express with x402-fetch
//     1.2.0 (v1) pay through our facilitator, balances moving exactly once; the official resource
//     server's settlement_pending retry; its /supported start-up check;
//   - the lost response recovered with a payment identifier.
package interop
