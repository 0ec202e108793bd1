package bmc

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"

	"go.yaml.in/yaml/v3"
)

// Credentials log in to a BMC. They print as the user name alone.
type Credentials struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// String keeps the password out of every message that formats
// credentials by accident.
func (c Credentials) String() string { return c.Username + ":<redacted>" }

// GoString is String for %#v.
func (c Credentials) GoString() string { return c.String() }

// LogValue is String for slog.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

// LoadCredentials reads a credentials file: YAML with username and
// password, readable by its owner alone (mode 0600 or stricter), as ssh
// demands of private keys.
func LoadCredentials(path string) (Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return Credentials{}, fmt.Errorf("BMC credentials %s: mode %04o lets others read them: chmod 600 %s", path, perm, path)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(f); err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials %s: %w", path, err)
	}
	c, err := ParseCredentials(buf.Bytes())
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials %s: %w", path, err)
	}
	return c, nil
}

// ParseCredentials reads the YAML of a credentials file. Its errors
// never quote the input.
func ParseCredentials(data []byte) (Credentials, error) {
	var c Credentials
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		// yaml's messages can quote a line of the file: the password.
		return Credentials{}, fmt.Errorf("not a mapping of username and password (YAML)")
	}
	if c.Username == "" {
		return Credentials{}, fmt.Errorf("username is empty")
	}
	if c.Password == "" {
		return Credentials{}, fmt.Errorf("password is empty")
	}
	return c, nil
}
