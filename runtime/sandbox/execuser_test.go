package sandbox

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

func quietLogger() *log.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

// fastProvisioner is a provisioner whose retries wait a millisecond.
func fastProvisioner(attempt func(context.Context) (bool, error)) *userProvisioner {
	p := newUserProvisioner(quietLogger(), attempt)
	p.backoff = func(int) time.Duration { return time.Millisecond }
	return p
}

func waitLoop(t *testing.T, p *userProvisioner) {
	t.Helper()
	select {
	case <-p.loopDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the retries did not end")
	}
}

func TestUserRetriesAreBounded(t *testing.T) {
	var n atomic.Int32
	p := fastProvisioner(func(context.Context) (bool, error) {
		n.Add(1)
		return true, errors.New("disk full")
	})
	p.retry()
	waitLoop(t, p)
	if got := n.Load(); got != userRetries {
		t.Fatalf("%d retries, want %d", got, userRetries)
	}
}

func TestUserRetriesEndOnSuccessOrForGood(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry bool
		err   error
		want  int32
	}{
		{"success", false, nil, 1},
		{"a failure a retry cannot help", false, errors.New("name taken"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			p := fastProvisioner(func(context.Context) (bool, error) {
				n.Add(1)
				return tc.retry, tc.err
			})
			p.retry()
			waitLoop(t, p)
			if got := n.Load(); got != tc.want {
				t.Fatalf("%d attempts, want %d", got, tc.want)
			}
		})
	}
}

// A stop that begins while an attempt is in flight lets that attempt
// finish (stop waits for it) and schedules no retry after it, even though
// the attempt fails in a way a retry could help.
func TestUserStopDuringAttemptSchedulesNoRetry(t *testing.T) {
	var n atomic.Int32
	inAttempt := make(chan struct{})
	release := make(chan struct{})
	p := fastProvisioner(func(ctx context.Context) (bool, error) {
		if n.Add(1) == 1 {
			close(inAttempt)
			<-release
		}
		if ctx.Err() != nil {
			t.Error("the attempt's context was cancelled by the stop: the guest would be left mid-edit")
		}
		return true, errors.New("transient")
	})
	p.retry()
	<-inAttempt
	stopped := make(chan struct{})
	go func() {
		p.stop(context.Background())
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("stop returned while an attempt was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not return once the attempt ended")
	}
	waitLoop(t, p)
	time.Sleep(20 * time.Millisecond) // several backoffs
	if got := n.Load(); got != 1 {
		t.Fatalf("%d attempts, want 1: a retry ran after the stop", got)
	}
}

// A stop before the first retry is due runs none.
func TestUserStopBeforeRetryRunsNone(t *testing.T) {
	var n atomic.Int32
	p := newUserProvisioner(quietLogger(), func(context.Context) (bool, error) {
		n.Add(1)
		return true, errors.New("transient")
	})
	p.backoff = func(int) time.Duration { return time.Hour }
	p.retry()
	p.stop(context.Background())
	waitLoop(t, p)
	if got := n.Load(); got != 0 {
		t.Fatalf("%d attempts after the stop, want 0", got)
	}
}

// An exec waits for the attempt in flight: it must see the user made.
func TestUserWaitJoinsAttemptInFlight(t *testing.T) {
	inAttempt := make(chan struct{})
	release := make(chan struct{})
	var finished atomic.Bool
	p := fastProvisioner(func(context.Context) (bool, error) {
		close(inAttempt)
		<-release
		finished.Store(true)
		return false, nil
	})
	p.retry()
	<-inAttempt
	go func() {
		time.Sleep(20 * time.Millisecond)
		close(release)
	}()
	p.wait(context.Background())
	if !finished.Load() {
		t.Fatal("wait returned before the attempt in flight ended")
	}
	waitLoop(t, p)
	// With none in flight, wait does not block.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p.wait(ctx)
	if ctx.Err() != nil {
		t.Fatal("wait blocked with no attempt in flight")
	}
}
