package redfishbmc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// maxBody bounds a request body: a boot PATCH or a Reset is a few dozen
// bytes.
const maxBody = 64 << 10

// DecodePatch reads a PATCH of a computer system: {"Boot": {...}} with
// the override's target, enabled and mode. Anything else is refused, as
// a BMC refuses a read-only or unknown property.
func DecodePatch(r io.Reader) (BootOverride, error) {
	var p struct {
		Boot *BootOverride `json:"Boot"`
	}
	if err := decodeStrict(r, &p); err != nil {
		return BootOverride{}, err
	}
	if p.Boot == nil {
		return BootOverride{}, fmt.Errorf("the body has no Boot: only the boot override can be changed")
	}
	b := *p.Boot
	if b.Target != "" && !slices.Contains(bootTargets, b.Target) {
		return BootOverride{}, fmt.Errorf("BootSourceOverrideTarget %q is not one of %s", b.Target, strings.Join(bootTargets, ", "))
	}
	if b.Enabled != "" && !slices.Contains(bootEnabled, b.Enabled) {
		return BootOverride{}, fmt.Errorf("BootSourceOverrideEnabled %q is not one of %s", b.Enabled, strings.Join(bootEnabled, ", "))
	}
	if b.Mode != "" && b.Mode != "Legacy" && b.Mode != "UEFI" {
		return BootOverride{}, fmt.Errorf("BootSourceOverrideMode %q is not one of Legacy, UEFI", b.Mode)
	}
	return b, nil
}

// DecodeReset reads a ComputerSystem.Reset action: {"ResetType": "..."}.
func DecodeReset(r io.Reader) (string, error) {
	var p struct {
		ResetType string `json:"ResetType"`
	}
	if err := decodeStrict(r, &p); err != nil {
		return "", err
	}
	if !slices.Contains(resetTypes, p.ResetType) {
		return "", fmt.Errorf("ResetType %q is not one of %s", p.ResetType, strings.Join(resetTypes, ", "))
	}
	return p.ResetType, nil
}

func decodeStrict(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("not a valid request body: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("not a valid request body: data after the JSON object")
	}
	return nil
}
