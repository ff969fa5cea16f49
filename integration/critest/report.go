package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// specResult is one spec's outcome in a ginkgo JSON report.
type specResult struct {
	// State is ginkgo's: passed, failed, skipped, panicked, timedout,
	// interrupted, aborted, pending.
	State string
	// Message is the failure's message ("" unless it failed), Location
	// the file:line it failed at.
	Message  string
	Location string
	RunTime  time.Duration
}

// passed reports whether the spec ran and passed.
func (r specResult) passed() bool { return r.State == "passed" }

// failed reports whether the spec ran and did not pass (skipped and
// pending are neither).
func (r specResult) failed() bool {
	return r.State != "passed" && r.State != "skipped" && r.State != "pending"
}

// ginkgoReport is the part of ginkgo's types.Report that is read here.
type ginkgoReport struct {
	SuiteSucceeded bool
	RunTime        time.Duration
	SpecReports    []struct {
		ContainerHierarchyTexts []string
		LeafNodeType            string
		LeafNodeText            string
		State                   string
		RunTime                 time.Duration
		Failure                 struct {
			Message  string
			Location struct {
				FileName   string
				LineNumber int
			}
		}
	}
}

// results are a run's specs by full name (the container texts and the
// spec's own, joined by spaces, as ginkgo's --focus matches them).
type results map[string]specResult

// readReport reads a ginkgo --json-report. Failures outside any spec (a
// BeforeSuite) are returned as suiteFailure.
func readReport(path string) (res results, suiteFailure string, runTime time.Duration, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", 0, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, "", 0, fmt.Errorf("%s: %w", path, err)
	}
	res = results{}
	for _, r := range reports {
		runTime += r.RunTime
		for _, s := range r.SpecReports {
			loc := ""
			if s.Failure.Location.FileName != "" {
				loc = fmt.Sprintf("%s:%d", s.Failure.Location.FileName, s.Failure.Location.LineNumber)
			}
			if s.LeafNodeType != "It" {
				if s.State != "passed" && s.State != "skipped" {
					suiteFailure += fmt.Sprintf("%s %s: %s (%s)\n", s.LeafNodeType, s.State, s.Failure.Message, loc)
				}
				continue
			}
			name := strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
			res[name] = specResult{State: s.State, Message: s.Failure.Message, Location: loc, RunTime: s.RunTime}
		}
	}
	return res, suiteFailure, runTime, nil
}

// counts are a run's numbers of specs by outcome.
type counts struct{ passed, failed, skipped int }

func (r results) counts() counts {
	var c counts
	for _, s := range r {
		switch {
		case s.passed():
			c.passed++
		case s.failed():
			c.failed++
		default:
			c.skipped++
		}
	}
	return c
}

func (c counts) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", c.passed, c.failed, c.skipped)
}

// names returns the names of the specs for which keep is true, sorted.
func (r results) names(keep func(specResult) bool) []string {
	var out []string
	for n, s := range r {
		if keep(s) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// readBaseline reads a baseline file: a spec name a line; blank lines and
// lines starting with # are comments.
func readBaseline(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			names = append(names, line)
		}
	}
	return names, sc.Err()
}

// writeBaseline writes the names as a baseline file under a header.
func writeBaseline(path, header string, names []string) error {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(header, "\n"), "\n") {
		b.WriteString("# " + l + "\n")
	}
	for _, n := range names {
		b.WriteString(n + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// brief is a failure message in one line: its first line, and for
// gomega's "Unexpected error:" the error's own line (the dump after it is
// Go syntax), else the next lines up to n in all; each trimmed, joined by
// " / ", at most 600 bytes.
func brief(msg string, n int) string {
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	var out []string
	for i, l := range lines {
		if len(out) == n {
			break
		}
		if l == "Unexpected error:" {
			// "<*status.Error | 0x...>:", then the error's text.
			if i+2 < len(lines) {
				out = append(out, lines[i+2])
			}
			break
		}
		out = append(out, l)
	}
	s := strings.Join(out, " / ")
	if len(s) > 600 {
		s = s[:600] + "..."
	}
	return s
}

// printFailures writes each failed spec of r with its failure.
func printFailures(w io.Writer, r results, names []string) {
	for _, n := range names {
		s := r[n]
		fmt.Fprintf(w, "  - %s\n      %s: %s\n", n, s.State, brief(s.Message, 4))
	}
}
