package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/x402-facilitator/x402-facilitator/idempotency"
)

// startJobs schedules the background jobs. Each only calls a service method, bounded in time, and
// logs what it changed.
func startJobs(log *slog.Logger, cfg *Config, ids *idempotency.Service) (*cron.Cron, error) {
	c := cron.New()
	_, err := c.AddFunc(cfg.RetentionSchedule, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n, err := ids.Compact(ctx)
		if err != nil {
			log.Warn("payment-identifier retention job", "err", err)
			return
		}
		if n > 0 {
			log.Info("payment-identifier retention: compacted stored answers past their window", "count", n)
		}
	})
	if err != nil {
		return nil, err
	}
	c.Start()
	return c, nil
}
