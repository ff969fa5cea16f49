package agent

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/guest/execuser"
)

// maxUserNotes bounds the notes of a provisioning report the host keeps.
const maxUserNotes = 8

// ExecUser is a user to provision in a container: its passwd entry and
// whether it gets sudo.
type ExecUser struct {
	User execuser.User
	Sudo bool
}

// UserProvision asks CreateContainer to provision a user before the
// container's runtime create.
type UserProvision struct {
	ExecUser
	// Timeout bounds the provisioning inside the call; 0: the call's
	// deadline alone.
	Timeout time.Duration
	// Required fails the create when the provisioning fails.
	Required bool
}

// UserReport is what the guest says a provisioning did (execuser.Status
// values) and what a fresh lookup found afterwards. It comes from the
// guest: CheckUserReport has checked it against the user asked for, and
// it is only logged.
type UserReport struct {
	Passwd, Group, Shadow, Home, Sudo string
	// ByName and ByUID are the passwd lines found, "" for none.
	ByName, ByUID string
	Notes         []string
	// Took is the guest's time for it.
	Took time.Duration
}

// UserOutcome is how the provisioning of a CreateContainer went.
type UserOutcome struct {
	// Report is set when it worked.
	Report *UserReport
	// Err is why it failed, when it was not required (a required one
	// fails the create); Retry says whether trying again may help.
	Err   error
	Retry bool
}

func toAPIUser(u ExecUser) *api.ExecUser {
	return &api.ExecUser{Name: u.User.Name, Uid: u.User.UID, Gid: u.User.GID, Home: u.User.Home, Shell: u.User.Shell, Sudo: u.Sudo}
}

// ProvisionUser provisions u in a created container's root filesystem,
// again (a retry, or after a restore). The report is checked.
func (c *Client) ProvisionUser(ctx context.Context, containerID string, u ExecUser) (UserReport, error) {
	op := fmt.Sprintf("provision exec user %s in container %s", u.User.Name, containerID)
	resp, err := c.agent.ProvisionUser(ctx, &api.ProvisionUserRequest{ContainerId: containerID, User: toAPIUser(u)})
	if err != nil {
		return UserReport{}, c.mapErr(op, err)
	}
	r := userReport(resp)
	if err := CheckUserReport(u.User, r); err != nil {
		return UserReport{}, fmt.Errorf("%s: %w", op, err)
	}
	return r, nil
}

// userReport copies what the guest sent, each string bounded.
func userReport(r *api.ExecUserReport) UserReport {
	if r == nil {
		return UserReport{}
	}
	out := UserReport{
		Passwd: trim(r.Passwd), Group: trim(r.Group), Shadow: trim(r.Shadow), Home: trim(r.Home), Sudo: trim(r.Sudo),
		ByName: trimLine(r.ByName), ByUID: trimLine(r.ByUid),
		Took: time.Duration(clampNs(r.TookNs)),
	}
	for i, n := range r.Notes {
		if i == maxUserNotes {
			out.Notes = append(out.Notes, fmt.Sprintf("[%d more]", len(r.Notes)-i))
			break
		}
		out.Notes = append(out.Notes, strings.ToValidUTF8(trim(n), "?"))
	}
	return out
}

// trimLine bounds a passwd line from the guest: its fields are bounded
// (a home of 4096 bytes at most), so a longer one is cut and then fails
// its check.
func trimLine(s string) string {
	const maxLine = 3*4096 + 64
	if len(s) > maxLine {
		return s[:maxLine]
	}
	return s
}

// CheckUserReport checks a report from the guest against the user asked
// for: an entry it says it created must resolve by name and by uid to
// exactly that user, and an entry it found must at least have the uid.
// A guest that says it did what it did not is caught here.
func CheckUserReport(u execuser.User, r UserReport) error {
	want := passwdLine(u)
	switch execuser.Status(r.Passwd) {
	case execuser.Created:
		if r.ByName != want || r.ByUID != want {
			return fmt.Errorf("the guest reports the entry created, but a lookup found %q by name and %q by uid, want %q: %w",
				r.ByName, r.ByUID, want, errdefs.ErrUnknown)
		}
	case execuser.Existed:
		f := strings.Split(r.ByUID, ":")
		if len(f) != 7 || f[2] != strconv.FormatUint(uint64(u.UID), 10) {
			return fmt.Errorf("the guest reports uid %d existing, but a lookup by uid found %q: %w", u.UID, r.ByUID, errdefs.ErrUnknown)
		}
	default:
		return fmt.Errorf("the guest reports passwd %q: %w", r.Passwd, errdefs.ErrUnknown)
	}
	return nil
}

// passwdLine is u's passwd line as provisioning writes it.
func passwdLine(u execuser.User) string {
	return fmt.Sprintf("%s:x:%d:%d::%s:%s", u.Name, u.UID, u.GID, u.Home, u.Shell)
}
