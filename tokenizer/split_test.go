package tokenizer

import (
	"slices"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"it's 42!", []string{"it", "'s", " 42", "!"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"end  ", []string{"end", "  "}},
	} {
		if got := split(c.in); !slices.Equal(got, c.want) {
			t.Errorf("split(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
