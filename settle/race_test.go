//go:build race

package settle_test

// raceEnabled: the race detector slows the single-goroutine simulator about sixfold and finds
// nothing there; under it only a smoke run of seeds is made (scripts/test.sh runs the full budget
// without it).
const raceEnabled = true
