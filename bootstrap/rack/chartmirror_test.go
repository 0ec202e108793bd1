package rack

import "testing"

func TestParseChartMirror(t *testing.T) {
	for in, want := range map[string]ChartMirror{
		"http://10.0.0.1:5000/charts":           {Host: "10.0.0.1:5000", Path: "charts", Insecure: true},
		"https://registry.example/cozy/charts/": {Host: "registry.example", Path: "cozy/charts"},
		"oci://registry.example/charts":         {Host: "registry.example", Path: "charts"},
	} {
		got, err := ParseChartMirror(in)
		if err != nil || got != want {
			t.Errorf("ParseChartMirror(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	if got, _ := ParseChartMirror("http://10.0.0.1:5000/charts"); got.URL() != "oci://10.0.0.1:5000/charts" {
		t.Errorf("URL() = %s", got.URL())
	}
	for _, bad := range []string{"", "10.0.0.1:5000/charts", "http://user@h/charts", "http://h/charts?x=1", "http:///charts", "http://h/a//b"} {
		if _, err := ParseChartMirror(bad); err == nil {
			t.Errorf("ParseChartMirror(%q) took it", bad)
		}
	}
}
