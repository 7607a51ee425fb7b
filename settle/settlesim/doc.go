// Package settlesim holds the building blocks of a deterministic simulator of the settlement
// engine, in the spirit of FoundationDB's and TigerBeetle's simulation testing (ARCHITECTURE.md,
// invariant 8): a simulated chain that executes exactly what the engine sends (Chain), a
// set of JSON-RPC views of it with their own faults (Backend, Balancer), an in-memory ledger with
// the Postgres ledger's semantics and its own faults (Ledger), and a clock (Clock).
//
// Everything is deterministic for a given sequence of calls: randomness comes only from the
// *rand.Rand a constructor is given (each component forks its own from it at construction, so
// the caller's generator is never touched afterwards), time only from the Clock, and nothing
// observable depends on map iteration order. The package starts no goroutine. Its types are
// safe for concurrent use, because the engine calls its Chain and Store from several goroutines;
// a simulation is reproducible only if its driver makes the order of those calls deterministic.
//
// The package depends on the engine only through the method sets it serves (ethrpc.Chain's,
// settle.Store's), so a driver can run the real engine against it.
package settlesim
