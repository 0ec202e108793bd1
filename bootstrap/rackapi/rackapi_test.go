package rackapi

import (
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
)

func TestMachineNamesTheRack(t *testing.T) {
	r := &Rack{Rack: &rack.Rack{Machines: []rack.Machine{{Hostname: "cp1"}, {Hostname: "w1"}}}}
	if _, err := r.Machine("w9"); err == nil || !strings.Contains(err.Error(), `no machine "w9" in the rack (its machines: cp1, w1)`) {
		t.Fatalf("got %v", err)
	}
	if m, err := r.Machine("w1"); err != nil || m.Hostname != "w1" {
		t.Fatalf("got %v, %v", m, err)
	}
	if r.Endpoint("w1") != "" {
		t.Error("an endpoint for a node the bootstrap recorded no address for")
	}
}

func TestEtcdVotersAndHealthy(t *testing.T) {
	e := Etcd{{Name: "cp3", Healthy: true}, {Name: "cp1", Healthy: true}, {Name: "cp2"}, {Name: "cp4", Learner: true, Healthy: true}}
	if got := e.Voters(); !slices.Equal(got, []string{"cp1", "cp2", "cp3"}) {
		t.Errorf("voters %v", got)
	}
	if got := e.Healthy(); !slices.Equal(got, []string{"cp1", "cp3"}) {
		t.Errorf("healthy %v: want the healthy voters, sorted", got)
	}
	if m, ok := e.Member("cp4"); !ok || !m.Learner {
		t.Errorf("cp4: %+v %v", m, ok)
	}
}
