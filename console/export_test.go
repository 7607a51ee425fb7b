package console

import "time"

// SetPollTicks makes c's live readers poll on ticks instead of a ticker, so a test decides when a
// Poll has passed. Call it before any stream opens.
func SetPollTicks(c *Console, ticks <-chan time.Time) {
	c.live.ticks = func(time.Duration) (<-chan time.Time, func()) { return ticks, func() {} }
}
