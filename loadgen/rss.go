package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// listeningPID finds the process listening on a local TCP port, the way ss -p does: the socket's
// inode from /proc/net/tcp{,6}, then the process holding an fd on that socket. Linux only; a
// process of another user is not found unless we may read its fds.
func listeningPID(port int) (int, error) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing listens on port %d", port)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		fds, _ := filepath.Glob(dir + "/fd/*")
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil && inodes[l] {
				return strconv.Atoi(filepath.Base(dir))
			}
		}
	}
	return 0, fmt.Errorf("port %d is listened on, but by no process whose fds we may read (pass --pid)", port)
}

// memStatus reads VmRSS (now) and VmHWM (peak since the process started), in bytes.
func memStatus(pid int) (rss, hwm uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q: %w", k, v, err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	return rss, hwm, sc.Err()
}

// Memory is a process's resident memory over the run.
type Memory struct {
	PID     int
	Peak    uint64 // largest VmRSS sampled during the run
	HWM     uint64 // VmHWM at the end: the peak since the process started, between samples too
	Samples int
	Err     string // why nothing was sampled
}

// sampler samples a process's VmRSS until stopped.
type sampler struct {
	mu   sync.Mutex
	m    Memory
	stop context.CancelFunc
	done chan struct{}
}

func startSampler(ctx context.Context, pid int, every time.Duration) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &sampler{m: Memory{PID: pid}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) sample() {
	rss, hwm, err := memStatus(s.m.PID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.m.Samples == 0 {
			s.m.Err = err.Error()
		}
		return
	}
	s.m.Samples++
	s.m.Peak = max(s.m.Peak, rss)
	s.m.HWM = max(s.m.HWM, hwm)
}

// finish takes a last sample and stops.
func (s *sampler) finish() Memory {
	s.stop()
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m.Samples > 0 {
		s.m.Err = ""
	}
	return s.m
}
