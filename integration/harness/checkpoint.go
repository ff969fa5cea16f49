package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CheckpointMediaType is the media type containerd gives a checkpoint
// image's checkpoint blob, whatever the runtime.
const CheckpointMediaType = "application/vnd.containerd.container.criu.checkpoint.criu.tar"

// CheckpointBlob returns the file in the content store that holds
// checkpoint image ref's checkpoint blob, and the blob's size.
func (c *Containerd) CheckpointBlob(ref string) (string, int64, error) {
	blobs := filepath.Join(c.Dir, "root", "io.containerd.content.v1.content", "blobs", "sha256")
	out, err := c.Ctr("image", "ls")
	if err != nil {
		return "", 0, err
	}
	var index string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == ref {
			index = strings.TrimPrefix(f[2], "sha256:")
		}
	}
	if index == "" {
		return "", 0, fmt.Errorf("no image %s in:\n%s", ref, out)
	}
	data, err := os.ReadFile(filepath.Join(blobs, index))
	if err != nil {
		return "", 0, err
	}
	var idx struct {
		Manifests []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
			Size      int64  `json:"size"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return "", 0, fmt.Errorf("index of %s: %w", ref, err)
	}
	for _, m := range idx.Manifests {
		if m.MediaType == CheckpointMediaType {
			return filepath.Join(blobs, strings.TrimPrefix(m.Digest, "sha256:")), m.Size, nil
		}
	}
	return "", 0, fmt.Errorf("checkpoint image %s has no %s: %s", ref, CheckpointMediaType, data)
}
