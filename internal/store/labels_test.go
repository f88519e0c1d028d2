package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

func TestParseLabelSelector(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat("k=v,", store.MaxSelectorPairs+1), ",")
	tests := []struct {
		sel     string
		want    map[string]string
		wantErr string // substring; "" = success
	}{
		{"", map[string]string{}, ""},
		{"  ", map[string]string{}, ""},
		{"a=b", map[string]string{"a": "b"}, ""},
		{"a=b, c = d", map[string]string{"a": "b", "c": "d"}, ""},
		{"a=", map[string]string{"a": ""}, ""},
		{"example.com/app=web", map[string]string{"example.com/app": "web"}, ""},
		{"a=b,a=b", map[string]string{"a": "b"}, ""},
		{"a=b,a=c", nil, `"a=c"`},
		{"a", nil, `invalid label selector pair "a"`},
		{"a=b,,c=d", nil, `pair ""`},
		{"=b", nil, `"=b"`},
		{"a==b", nil, `"a==b"`},
		{"a!=b", nil, `"a!=b"`},
		{"a=b c", nil, `"a=b c"`},
		{"-a=b", nil, `"-a=b"`},
		{"Example.com/a=b", nil, "prefix"},
		{"a=" + strings.Repeat("v", 64), nil, "longer than 63"},
		{strings.Repeat("k", 64) + "=v", nil, "longer than 63"},
		{many, nil, "at most 64"},
	}
	for _, tt := range tests {
		t.Run(tt.sel, func(t *testing.T) {
			got, err := store.ParseLabelSelector(tt.sel)
			if tt.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseLabelSelector(%q) error = %v, want InvalidArgument containing %q", tt.sel, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseLabelSelector(%q): %v", tt.sel, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("ParseLabelSelector(%q) (-want +got):\n%s", tt.sel, diff)
			}
		})
	}
}

func TestValidateLabels(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		ok     bool
	}{
		{"nil", nil, true},
		{"simple", map[string]string{"app": "web", "tier": "a.b-c_d"}, true},
		{"prefixed", map[string]string{"app.kubernetes.io/name": "x"}, true},
		{"max lengths", map[string]string{strings.Repeat("p", 63) + "." + strings.Repeat("q", 63) + "/" + strings.Repeat("n", 63): strings.Repeat("v", 63)}, true},
		{"key too long", map[string]string{strings.Repeat("p", 250) + "/name": "v"}, false},
		{"empty key", map[string]string{"": "v"}, false},
		{"empty name", map[string]string{"example.com/": "v"}, false},
		{"value ends with dash", map[string]string{"a": "b-"}, false},
		{"value with slash", map[string]string{"a": "b/c"}, false},
		{"unicode", map[string]string{"a": "é"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := store.ValidateLabels(tt.labels)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidateLabels(%v) = %v, want ok=%v", tt.labels, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ValidateLabels error %v is not InvalidArgument", err)
			}
		})
	}
}

func TestLimit(t *testing.T) {
	for _, tt := range []struct{ in, want int }{{0, 100}, {-5, 100}, {1, 1}, {1000, 1000}, {1001, 1000}} {
		if got := store.Limit(tt.in); got != tt.want {
			t.Errorf("Limit(%d) = %d, want %d", tt.in, got, tt.want)
		}
	}
}
