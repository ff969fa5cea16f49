package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// BundleStateFile is the file in a container's bundle where `start` records
// what `delete` needs to clean up after a shim that died (even SIGKILLed).
// It is written before the shim, and so the VM, exists.
const BundleStateFile = "cocoon.json"

// bundleState is what BundleStateFile holds.
type bundleState struct {
	// Namespace and ContainerID name the container.
	Namespace   string `json:"namespace"`
	ContainerID string `json:"container_id"`
	// SandboxID is the sandbox the container runs in.
	SandboxID string `json:"sandbox_id"`
	// SandboxDir is the sandbox's state directory
	// (<runtime.state_dir>/<namespace>/<sandbox-id>).
	SandboxDir string `json:"sandbox_dir"`
	// Address is the socket of the shim serving the sandbox.
	Address string `json:"address"`
}

func writeBundleState(bundle string, st bundleState) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(bundle, BundleStateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("save shim state in bundle: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(bundle, BundleStateFile)); err != nil {
		return fmt.Errorf("save shim state in bundle: %w", err)
	}
	return nil
}

// readBundleState reads what start saved; os.ErrNotExist if it saved
// nothing (start failed before).
func readBundleState(bundle string) (bundleState, error) {
	var st bundleState
	data, err := os.ReadFile(filepath.Join(bundle, BundleStateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("%s: %w", BundleStateFile, err)
	}
	return st, st.validate()
}

// validate checks that SandboxDir is a sandbox state directory, so that a
// damaged file never makes delete remove anything else.
func (st bundleState) validate() error {
	d := st.SandboxDir
	ok := filepath.IsAbs(d) && filepath.Clean(d) == d &&
		filepath.Base(d) == st.SandboxID && filepath.Base(filepath.Dir(d)) == st.Namespace &&
		st.SandboxID != "" && st.Namespace != ""
	if !ok {
		return errors.New(BundleStateFile + ": sandbox_dir is not <state_dir>/<namespace>/<sandbox_id>")
	}
	return nil
}
