package settlesim

import (
	"sync"
	"time"
)

// Clock is the simulation's only source of time: the chain stamps blocks with it, the ledger its
// rows, and a driver hands Now to the engine (settle.Config.Now). It moves only when told to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now is the simulated time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d; a negative d is ignored, since no component here (nor
// the engine) is written for time that goes back.
func (c *Clock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
