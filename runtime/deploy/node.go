package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// NodeLabeler sets and removes a label of a Kubernetes node.
type NodeLabeler interface {
	// SetNodeLabel sets the node's label key to value.
	SetNodeLabel(ctx context.Context, node, key, value string) error
	// RemoveNodeLabel removes the node's label key.
	RemoveNodeLabel(ctx context.Context, node, key string) error
}

// ServiceAccountDir is where a pod's service account credentials are.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// APIServer is the Kubernetes API server, reached with a pod's service
// account: a JSON merge patch of the node's labels, which needs only
// `patch` on nodes.
type APIServer struct {
	// URL is the server's base URL.
	URL string
	// TokenFile holds the bearer token; read at each call, since the
	// kubelet rotates it.
	TokenFile string
	// Client trusts the server's CA.
	Client *http.Client
}

// InCluster is the API server of the cluster this pod runs in, from the
// environment the kubelet sets and the service account's files.
func InCluster() (*APIServer, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: %w: not in a pod (label the node by hand, or leave --node empty)", errdefs.ErrFailedPrecondition)
	}
	return NewAPIServer("https://"+net.JoinHostPort(host, port), ServiceAccountDir+"/token", ServiceAccountDir+"/ca.crt")
}

// NewAPIServer is the API server at url, trusting the CA certificates in
// caFile, authenticating with the token in tokenFile.
func NewAPIServer(url, tokenFile, caFile string) (*APIServer, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: %w: no certificate", caFile, errdefs.ErrInvalidArgument)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &APIServer{URL: url, TokenFile: tokenFile, Client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}, nil
}

// SetNodeLabel implements NodeLabeler.
func (a *APIServer) SetNodeLabel(ctx context.Context, node, key, value string) error {
	return a.patchLabel(ctx, node, key, &value)
}

// RemoveNodeLabel implements NodeLabeler.
func (a *APIServer) RemoveNodeLabel(ctx context.Context, node, key string) error {
	return a.patchLabel(ctx, node, key, nil)
}

// patchLabel sets the label, or removes it (value nil: a merge patch's
// null).
func (a *APIServer) patchLabel(ctx context.Context, node, key string, value *string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{key: value}}})
	if err != nil {
		return err
	}
	token, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return err
	}
	u := strings.TrimSuffix(a.URL, "/") + "/api/v1/nodes/" + url.PathEscape(node)
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := a.Client.Do(req)
	if err != nil {
		return fmt.Errorf("patch node %s: %w", node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var status struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(msg, &status) == nil && status.Message != "" {
		msg = []byte(status.Message)
	}
	err = fmt.Errorf("patch node %s: %s: %s", node, resp.Status, bytes.TrimSpace(msg))
	switch resp.StatusCode {
	case http.StatusNotFound:
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("%w: %w", errdefs.ErrPermissionDenied, err)
	}
	return err
}
