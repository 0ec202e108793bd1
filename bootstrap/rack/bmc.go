package rack

import (
	"fmt"
	"path/filepath"

	"cozy.dev/cozy/bmc"
)

// checkBMCs checks each machine's BMC address and that it names a
// credentials file, and resolves the file's path against the rack's
// directory. The file itself is read only where credentials are used
// (BMCTarget) and by CheckBMCCredentials (`rack validate`): rendering the
// platform or Talos configs from a rack needs no BMC secret at hand.
func (r *Rack) checkBMCs(dir string) []Problem {
	var ps []Problem
	for i := range r.Machines {
		b := r.Machines[i].BMC
		if b == nil {
			continue
		}
		path := fmt.Sprintf("machines[%d].bmc", i)
		if b.Address == "" {
			ps = append(ps, errorf(path+".address", "required: redfish+https://HOST[:PORT] or ipmi://HOST[:PORT]"))
		} else if _, err := bmc.ParseAddress(b.Address); err != nil {
			ps = append(ps, errorf(path+".address", "%v", err))
		}
		if b.CredentialsFile == "" {
			ps = append(ps, errorf(path+".credentialsFile", "required: a file next to the rack with username and password, mode 0600"))
			continue
		}
		b.credentialsPath = b.CredentialsFile
		if !filepath.IsAbs(b.credentialsPath) {
			b.credentialsPath = filepath.Join(dir, b.credentialsPath)
		}
	}
	return ps
}

// CheckBMCCredentials reads every machine's BMC credentials file as
// BMCTarget will: there, readable by its owner alone, a username and a
// password. Its problems never quote the file.
func (r *Rack) CheckBMCCredentials() []Problem {
	var ps []Problem
	for i, m := range r.Machines {
		if m.BMC == nil || m.BMC.credentialsPath == "" {
			continue
		}
		if _, err := bmc.LoadCredentials(m.BMC.credentialsPath); err != nil {
			path := fmt.Sprintf("machines[%d].bmc.credentialsFile", i)
			ps = append(ps, Problem{Path: path, Line: lineOf(r.lines, path), Message: err.Error()})
		}
	}
	return ps
}

// BMCTarget is what `cozyctl machine` and the bootstrap need to reach a
// machine's BMC; it reads the credentials file now.
func (m *Machine) BMCTarget() (bmc.Target, error) {
	if m.BMC == nil {
		return bmc.Target{}, fmt.Errorf("machine %s has no bmc in the rack", m.Hostname)
	}
	addr, err := bmc.ParseAddress(m.BMC.Address)
	if err != nil {
		return bmc.Target{}, fmt.Errorf("machine %s: %w", m.Hostname, err)
	}
	path := m.BMC.credentialsPath
	if path == "" {
		path = m.BMC.CredentialsFile
	}
	creds, err := bmc.LoadCredentials(path)
	if err != nil {
		return bmc.Target{}, fmt.Errorf("machine %s: %w", m.Hostname, err)
	}
	return bmc.Target{Address: addr, Credentials: creds, InsecureSkipVerify: m.BMC.InsecureSkipVerify}, nil
}
