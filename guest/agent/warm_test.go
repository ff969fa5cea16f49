package agent

import "testing"

func TestWarmSpecCodecs(t *testing.T) {
	if err := warmSpecCodecs(); err != nil {
		t.Fatal(err)
	}
}
