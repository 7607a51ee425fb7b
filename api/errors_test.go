package api

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
)

// TestRetryAfterRounding: a wait is sent as whole seconds rounded up, and never as less than one.
func TestRetryAfterRounding(t *testing.T) {
	for wait, want := range map[time.Duration]string{
		0: "1", -time.Second: "1", time.Nanosecond: "1", 500 * time.Millisecond: "1", time.Second: "1",
		1500 * time.Millisecond: "2", 7 * time.Second: "7", time.Minute: "60",
	} {
		c := echo.New().NewContext(httptest.NewRequest("GET", "/", nil), httptest.NewRecorder())
		setRetryAfter(c, wait)
		if got := c.Response().Header().Get("Retry-After"); got != want {
			t.Errorf("wait %s: Retry-After %q, want %q", wait, got, want)
		}
	}
}
