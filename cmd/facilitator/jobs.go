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

// The jobs' names, as they beat (facilitator_loop_last_run_timestamp_seconds{loop}).
const (
	jobReconcile   = "reconcile_settlements"
	jobIndexHealth = "reconcile_index_health"
	jobRetention   = "retention"
)

// beater hears that a job ran to the end without an error (metrics): a job that keeps failing,
// or hangs, stops beating.
type beater interface {
	Beat(loop, network string, at time.Time)
}

// startJobs schedules the background jobs. Each only calls a service method, bounded in time, and
// logs what it changed.
// sessionPruner deletes console sessions that ended (postgres.DB).
type sessionPruner interface {
	PruneConsoleSessions(ctx context.Context, at time.Time, limit int) (int64, error)
}

func startJobs(log *slog.Logger, cfg *Config, ids *paymentid.Service, rec *reconcile.Jobs, hooks *notify.Dispatcher, sessions sessionPruner, obs beater) (*cron.Cron, error) {
	// SkipIfStillRunning: a slow run is never stacked under the next one.
	c := cron.New(cron.WithChain(cron.SkipIfStillRunning(cron.DiscardLogger)))
	bounded := func(name string, run func(context.Context) (reconcile.Changes, error)) func() {
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := run(ctx); err != nil {
				log.Warn("reconcile job", "job", name, "err", err)
				return
			}
			obs.Beat(name, "", time.Now())
		}
	}
	if _, err := c.AddFunc(cfg.ReconcileSchedule, bounded(jobReconcile, rec.Settlements)); err != nil {
		return nil, fmt.Errorf("reconcile-schedule: %w", err)
	}
	if _, err := c.AddFunc(cfg.IndexHealthSchedule, bounded(jobIndexHealth, rec.IndexHealth)); err != nil {
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
		pruned, perr := hooks.Prune(ctx)
		if perr != nil {
			log.Warn("webhook delivery retention job", "err", perr)
		}
		if pruned > 0 {
			log.Info("webhook delivery retention: deleted finished deliveries past their retention", "count", pruned)
		}
		// An ended session opens nothing already; deleting it only keeps the table small.
		var ended int64
		var serr error
		for {
			n, err := sessions.PruneConsoleSessions(ctx, time.Now(), 10_000)
			ended += n
			if serr = err; err != nil || n < 10_000 {
				break
			}
		}
		if serr != nil {
			log.Warn("console session retention job", "err", serr)
		}
		if ended > 0 {
			log.Info("console session retention: deleted expired and logged-out sessions", "count", ended)
		}
		if err == nil && perr == nil && serr == nil {
			obs.Beat(jobRetention, "", time.Now())
		}
	})
	if err != nil {
		return nil, fmt.Errorf("retention-schedule: %w", err)
	}
	c.Start()
	return c, nil
}
