package tiers

import (
	"strings"
	"testing"
)

func TestHBMOptions(t *testing.T) {
	ok := HBMOptions{Capacity: 1 << 30}
	ok.EnsureDefaults()
	if ok.SlabSize != DefaultSlabSize || ok.Validate() != nil {
		t.Fatalf("defaults: %+v, %v", ok, ok.Validate())
	}
	for _, tc := range []struct {
		opts  HBMOptions
		field string
	}{
		{HBMOptions{}, "HBMOptions.Capacity"},
		{HBMOptions{Capacity: -5}, "HBMOptions.Capacity"},
		{HBMOptions{Device: -1, Capacity: 1 << 30}, "HBMOptions.Device"},
		{HBMOptions{Capacity: 1 << 30, SlabSize: 1000}, "HBMOptions.SlabSize"},
		{HBMOptions{Capacity: 1 << 20, SlabSize: 2 << 20}, "HBMOptions.Capacity"},
	} {
		tc.opts.EnsureDefaults()
		if err := tc.opts.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: Validate() = %v, want an error naming %s", tc.opts, err, tc.field)
		}
	}
}
