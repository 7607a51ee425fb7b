// The command-line flags every script here takes: --flag value or --flag=value.

// parseArgs returns the flags in argv as an object keyed by flag name (without the dashes); it
// throws on a bare argument, a flag without its value, or a missing (or empty) required flag.
export function parseArgs(argv, required = []) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (!arg.startsWith("--")) throw new Error(`unexpected argument: ${arg}`);
    const eq = arg.indexOf("=");
    if (eq !== -1) {
      out[arg.slice(2, eq)] = arg.slice(eq + 1);
    } else {
      if (i + 1 >= argv.length) throw new Error(`missing value for ${arg}`);
      out[arg.slice(2)] = argv[++i];
    }
  }
  for (const name of required) {
    if (!out[name]) throw new Error(`--${name} is required`);
  }
  return out;
}
