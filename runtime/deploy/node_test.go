package deploy

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// TestAPIServerLabels: the label is a JSON merge patch of the node, with
// the service account's token, over TLS checked against its CA; a
// refusal is a permission error.
func TestAPIServerLabels(t *testing.T) {
	var got []map[string]any
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPatch || r.URL.Path != "/api/v1/nodes/node-1" ||
			r.Header.Get("Content-Type") != "application/merge-patch+json" || r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"kind":"Status","message":"nodes \"node-1\" is forbidden"}`)
			return
		}
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		got = append(got, body)
		io.WriteString(w, `{"kind":"Node"}`)
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("tok\n"), 0o600)
	a, err := NewAPIServer(srv.URL, token, ca)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.SetNodeLabel(ctx, "node-1", NodeLabel, NodeLabelValue); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveNodeLabel(ctx, "node-1", NodeLabel); err != nil {
		t.Fatal(err)
	}
	want := `[{"metadata":{"labels":{"cocoon.io/runtime":"true"}}},{"metadata":{"labels":{"cocoon.io/runtime":null}}}]`
	if b, _ := json.Marshal(got); string(b) != want {
		t.Fatalf("patches %s, want %s", b, want)
	}
	err = a.SetNodeLabel(ctx, "node-2", NodeLabel, NodeLabelValue)
	if !errdefs.IsPermissionDenied(err) || err.Error() != `permission denied: patch node node-2: 403 Forbidden: nodes "node-1" is forbidden` {
		t.Fatalf("a refused patch: %v", err)
	}
	os.WriteFile(ca, []byte("not a certificate"), 0o644)
	if _, err := NewAPIServer(srv.URL, token, ca); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := InCluster(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("InCluster outside a pod: %v", err)
	}
}
