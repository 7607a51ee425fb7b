// Compiles one Solidity file with solc-js and prints {"abi": [...], "bytecode": "0x..."}.
//
//   node solc.mjs <file.sol> [node_modules dir] [contract name]
//
// solc is loaded from the given node_modules (default: resolved from this
// script's location) so the script also works when copied to a temp dir.
// The contract defaults to the file's base name.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [file, nodeModules, contractArg] = process.argv.slice(2);
if (!file) {
  console.error('usage: node solc.mjs <file.sol> [node_modules dir] [contract name]');
  process.exit(2);
}
const require = createRequire(
  nodeModules ? path.join(path.dirname(path.resolve(nodeModules)), 'package.json') : import.meta.url,
);
const solc = require('solc');

const sourceName = path.basename(file);
const contract = contractArg || path.basename(file, '.sol');
const input = {
  language: 'Solidity',
  sources: { [sourceName]: { content: readFileSync(file, 'utf8') } },
  settings: {
    optimizer: { enabled: true, runs: 200 },
    outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object'] } },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === 'error');
if (errors.length > 0) {
  console.error(errors.map((e) => e.formattedMessage).join('\n'));
  process.exit(1);
}
const built = output.contracts?.[sourceName]?.[contract];
if (!built) {
  console.error(`contract ${contract} not found in ${file}`);
  process.exit(1);
}
process.stdout.write(JSON.stringify({ abi: built.abi, bytecode: '0x' + built.evm.bytecode.object }) + '\n');
