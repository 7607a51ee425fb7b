package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
)

// startJobs schedules the background jobs. Each only calls a service method, bounded in time, and
// logs what it changed.
func startJobs(log *slog.Logger, cfg *Config, ids *paymentid.Service, rec *reconcile.Jobs, hooks *notify.Dispatcher) (*cron.Cron, error) {
	// SkipIfStillRunning: a slow run is never stacked under the next one.
	c := cron.New(cron.WithChain(cron.SkipIfStillRunning(cron.DiscardLogger)))
	bounded := func(name string, run func(context.Context) (reconcile.Changes, error)) func() {
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := run(ctx); err != nil {
				log.Warn("reconcile job", "job", name, "err", err)
			}
		}
	}
	if _, err := c.AddFunc(cfg.ReconcileSchedule, bounded("settlements", rec.Settlements)); err != nil {
		return nil, fmt.Errorf("reconcile-schedule: %w", err)
	}
	if _, err := c.AddFunc(cfg.IndexHealthSchedule, bounded("index-health", rec.IndexHealth)); err != nil {
		return nil, fmt.Errorf("index-health-schedule: %w", err)
	}
	_, err := c.AddFunc(cfg.RetentionSchedule, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n, err := ids.Compact(ctx)
		if err != nil {
			log.Warn("payment-identifier retention job", "err", err)
		}
		if n > 0 {
			log.Info("payment-identifier retention: compacted stored answers past their window", "count", n)
		}
		pruned, err := hooks.Prune(ctx)
		if err != nil {
			log.Warn("webhook delivery retention job", "err", err)
		}
		if pruned > 0 {
			log.Info("webhook delivery retention: deleted finished deliveries past their retention", "count", pruned)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("retention-schedule: %w", err)
	}
	c.Start()
	return c, nil
}
