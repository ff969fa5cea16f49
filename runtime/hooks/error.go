package hooks

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hookError is one hook's failure: which hook, how it failed and the end
// of what it printed.
type hookError struct {
	// kind, index and path name the hook: its place in its kind's list and
	// the binary it runs.
	kind  Kind
	index int
	path  string
	// how says how it failed, as a user would want to read it: "exit
	// status 1", "timed out after 5s", "could not start: ...".
	how string
	// output is the end of the hook's stdout and stderr, trimmed; cut says
	// that its beginning was dropped to keep it within outputMax.
	output string
	cut    bool
	// class is the errdefs sentinel of the failure, nil when cause is
	// class enough (a context's error).
	class error
	// cause is the error under the failure (an *exec.ExitError, a start
	// error, a context's error), nil when there is none.
	cause error
}

// Error names the hook, says how it failed and ends with its output, so
// that a cut message still keeps the hook's last words.
func (e *hookError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s hook %d %q: %s", e.kind, e.index, e.path, e.how)
	switch {
	case e.output == "":
	case e.cut:
		fmt.Fprintf(&b, "; output (its last %d bytes): %s", outputMax, e.output)
	default:
		fmt.Fprintf(&b, "; output: %s", e.output)
	}
	return b.String()
}

// Unwrap gives errors.Is and errors.As the failure's class and cause.
func (e *hookError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.class, e.cause} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// validate checks h's definition as the runtime-spec has it: an absolute
// path, and a timeout, if any, greater than zero.
func validate(k Kind, i int, h specs.Hook) error {
	bad := func(how string) error {
		return &hookError{kind: k, index: i, path: h.Path, how: how, class: errdefs.ErrInvalidArgument}
	}
	if !filepath.IsAbs(h.Path) {
		return bad("path is not absolute")
	}
	if h.Timeout != nil && *h.Timeout <= 0 {
		return bad(fmt.Sprintf("timeout must be greater than zero, not %d", *h.Timeout))
	}
	return nil
}
