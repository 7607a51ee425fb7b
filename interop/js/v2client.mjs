// The official v2 client agent-v2.mjs and agent.mjs pay with. (agent-v1.mjs, which is built from
// the v1 package alone, does not import this.)

import { privateKeyToAccount } from "viem/accounts";
import { x402Client } from "@x402/fetch";
import { toClientEvmSigner } from "@x402/evm";
import { registerExactEvmScheme } from "@x402/evm/exact/client";

// exactEvmClient is an x402Client paying with key through the exact-EVM client scheme. With
// args.asset and args.network that asset is its spend controls' allow-list (by default the client
// refuses assets it does not know); without them spend controls are off.
export function exactEvmClient(key, args) {
  const client = new x402Client();
  registerExactEvmScheme(client, { signer: toClientEvmSigner(privateKeyToAccount(key)) });
  if (args.asset && args.network) {
    client.setSpendControls({ allowedAssets: [{ network: args.network, asset: args.asset }] });
  } else {
    client.setSpendControls(false);
  }
  return client;
}
