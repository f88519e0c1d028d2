package config

import (
	"os"
	"regexp"
	"testing"
)

// TestDocsExamplesDecode keeps docs/configuration.md and the schema in step:
// every TOML example there must decode strictly.
func TestDocsExamplesDecode(t *testing.T) {
	data, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatalf("read docs: %v", err)
	}
	blocks := regexp.MustCompile("(?s)```toml\n(.*?)```").FindAllSubmatch(data, -1)
	if len(blocks) < 3 {
		t.Fatalf("found %d TOML examples in docs/configuration.md, want at least 3", len(blocks))
	}
	for i, b := range blocks {
		if _, err := decodeFile("example", b[1]); err != nil {
			t.Errorf("docs TOML example %d: %v", i, err)
		}
	}
}
