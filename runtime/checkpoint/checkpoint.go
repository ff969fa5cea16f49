// Package checkpoint is the on-disk format of a Cocoon checkpoint: the
// directory containerd hands Task.Checkpoint, tars whole into its content
// store, and extracts again for a restore.
//
// A checkpoint directory holds the VMM's state file, one sparse-encoded
// file per scratch disk (sparse.go), and manifest.json, which describes
// the sandbox that was saved and lists every other file with its size and
// sha256. Writer fills a directory; Verify checks one before anything of
// it is used.
//
// At restore the directory is untrusted input: the tar may be truncated,
// tampered with or edited by hand. So the manifest is bounded in size and
// in every list, each name in it is a single plain path element, files
// are opened without following symlinks and only if the manifest lists
// them, and each refusal wraps ErrInvalid and errdefs.ErrInvalidArgument
// with a sentence naming the file and what is wrong with it.
package checkpoint

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// FormatVersion is the manifest format this package writes and reads.
// Format 2: every VM's RAM is the memory backend "mem" and its state is
// saved with x-ignore-shared, which changes the stream; format 1's
// states do not load.
const FormatVersion = 2

// ManifestName is the manifest's file name in a checkpoint directory.
const ManifestName = "manifest.json"

// StateName is the conventional name of the VMM state file.
const StateName = "vm.state"

// ErrInvalid is wrapped, together with errdefs.ErrInvalidArgument, by
// every refusal of Verify, ReadManifest and ReadSparse.
var ErrInvalid = errors.New("invalid checkpoint")

// invalidClass is the error every refusal wraps: it is both ErrInvalid
// and errdefs.ErrInvalidArgument, and reads as the former.
type invalidClass struct{}

func (invalidClass) Error() string   { return ErrInvalid.Error() }
func (invalidClass) Unwrap() []error { return []error{ErrInvalid, errdefs.ErrInvalidArgument} }

// invalidf is the refusal of checkpoint dir for the reason format says.
func invalidf(dir, format string, args ...any) error {
	return fmt.Errorf("checkpoint %s: %s: %w", dir, fmt.Sprintf(format, args...), invalidClass{})
}

// namePattern is a file name in a checkpoint directory.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidName checks that name is one plain path element fit to name a file
// of a checkpoint: 1-128 characters of [A-Za-z0-9._-], starting
// alphanumeric, without "..".
func ValidName(name string) error {
	if !namePattern.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("%q: not a plain name (1-128 characters of [A-Za-z0-9._-], starting alphanumeric, no \"..\"): %w",
			name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// idPattern is a containerd-style namespace, sandbox or container id, as
// runtime/sandbox checks them (it cannot be imported from here: it
// imports this package).
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$`)

// validID checks a namespace, sandbox id or container id.
func validID(what, s string) error {
	if !idPattern.MatchString(s) {
		return fmt.Errorf("%s %q: want 1-76 characters of [A-Za-z0-9_.-], starting alphanumeric", what, s)
	}
	return nil
}
