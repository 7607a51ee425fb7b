package settle_test

import (
	"log/slog"
	"testing"
)

// testLogger sends the engine's logs to t.Log, so a failing test shows what the engine did.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tbWriter struct{ t testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
