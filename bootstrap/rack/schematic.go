package rack

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"

	"go.yaml.in/yaml/v3"
)

// factorySchematic is the Image Factory's schematic document. Its ID is
// the SHA-256 of this document marshalled by yaml.v3, so the field names,
// order and omitempty rules here must stay as the factory defines them.
type factorySchematic struct {
	Customization factoryCustomization `yaml:"customization"`
}

type factoryCustomization struct {
	ExtraKernelArgs  []string                `yaml:"extraKernelArgs,omitempty"`
	SystemExtensions factorySystemExtensions `yaml:"systemExtensions,omitempty"`
}

type factorySystemExtensions struct {
	OfficialExtensions []string `yaml:"officialExtensions,omitempty"`
}

// SchematicDocument is the schematic as the factory's POST /schematics
// takes it.
func (s Schematic) SchematicDocument() ([]byte, error) {
	return yaml.Marshal(factorySchematic{Customization: factoryCustomization{
		ExtraKernelArgs:  s.ExtraKernelArgs,
		SystemExtensions: factorySystemExtensions{OfficialExtensions: s.Extensions},
	}})
}

// SchematicID is the schematic's Image Factory ID: the one given, or the
// one the factory computes for the customisation.
func (s Schematic) SchematicID() (string, error) {
	if s.ID != "" {
		return s.ID, nil
	}
	doc, err := s.SchematicDocument()
	if err != nil {
		return "", fmt.Errorf("marshal schematic: %w", err)
	}
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:]), nil
}

// InstallImage is the installer image the nodes install from: the rack's
// override, or the factory's metal installer for the schematic.
func (r *Rack) InstallImage() (string, error) {
	if r.Talos.InstallImage != "" {
		return r.Talos.InstallImage, nil
	}
	id, err := r.Talos.Schematic.SchematicID()
	if err != nil {
		return "", err
	}
	u, err := url.Parse(r.Talos.Factory)
	if err != nil {
		return "", fmt.Errorf("talos.factory: %w", err)
	}
	return fmt.Sprintf("%s/metal-installer/%s:%s", u.Host, id, r.Talos.Version), nil
}

// BootAssetURL is where the factory serves a PXE asset for the schematic:
// kernel-amd64, initramfs-amd64.xz (and the arm64 ones).
func (r *Rack) BootAssetURL(asset string) (string, error) {
	id, err := r.Talos.Schematic.SchematicID()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/image/%s/%s/%s", r.Talos.Factory, id, r.Talos.Version, asset), nil
}
