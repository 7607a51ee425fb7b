package facilitator

import (
	"context"
	"time"
)

// Sleep waits d, or less when ctx ends first; it reports whether the whole d passed. It lives here
// because the loops that back off before trying again (the client's retries, the indexer's, the
// head subscription's) share no package but this one.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
