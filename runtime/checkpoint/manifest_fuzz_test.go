package checkpoint

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeManifest: whatever manifest.json holds, decoding it does not
// panic, refuses with a reason, and what it accepts names only plain
// files and reads back the same once written out again.
func FuzzDecodeManifest(f *testing.F) {
	m := fixtureManifest()
	m.Format = FormatVersion
	m.Files = []File{
		{Name: StateName, Size: 2000, SHA256: "0a12e46c85e2c84c194e9b6426b459eb5280b2c704f60db8a53b215f7403cb9f"},
		{Name: "disk-c1.sparse", Size: 8248, SHA256: "79d6d39685964f3f830c21f0645a28ba3590f9250bc07d2489e1ed7a191fd2d6"},
	}
	good, err := json.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{string(good), `{"format":2}`, `{"format":1}`, `null`, `[]`, `{"format":"1"}`, ``} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeManifest(data)
		if err != nil {
			if m != nil {
				t.Errorf("a refused manifest was returned")
			}
			if errors.Is(err, ErrInvalid) {
				t.Errorf("decodeManifest's reason %v is already classed: its callers class it", err)
			}
			return
		}
		for _, f := range m.Files {
			if ValidName(f.Name) != nil {
				t.Errorf("accepted file name %q", f.Name)
			}
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := decodeManifest(again)
		if err != nil {
			t.Fatalf("an accepted manifest, written out again, is refused: %v", err)
		}
		if !equalJSON(t, m, m2) {
			t.Errorf("an accepted manifest reads back different")
		}
	})
}
