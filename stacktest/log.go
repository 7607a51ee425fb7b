package stacktest

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Logger sends logs to t.Log until the test ends, so a failing test shows what the engine,
// indexer or service did.
func Logger(t testing.TB) *slog.Logger {
	log, _ := QuietableLogger(t)
	return log
}

// QuietableLogger is Logger that also stops at quiet: background goroutines may log after their
// test returned, and testing panics on a Log after the test's end.
func QuietableLogger(t testing.TB) (log *slog.Logger, quiet func()) {
	return QuietableLoggerAt(t, slog.LevelDebug)
}

// QuietableLoggerAt is QuietableLogger from level up.
func QuietableLoggerAt(t testing.TB, level slog.Level) (log *slog.Logger, quiet func()) {
	w := &tbWriter{t: t}
	t.Cleanup(w.quiet)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), w.quiet
}

type tbWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *tbWriter) quiet() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(p[:len(p)-1]))
	}
	return len(p), nil
}

// SyncBuffer collects output (a server's or a child process's logs) written from several
// goroutines while the test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
