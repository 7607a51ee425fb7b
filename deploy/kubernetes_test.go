package deploy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// minDrain is the least stop timeout a supervisor should give serve after SIGTERM: Main.Close
// (cmd/facilitator/wiring.go) bounds the HTTP drain, each network's indexer (one after another)
// and the engine at 10 s each, so one network needs 30 s; 60 s leaves room for a few more and
// the jobs. The examples say how to raise theirs.
const minDrain = 60 * time.Second

// documentedConfig is what docs/configuration.md's "Flags and environment" table names: the
// flags (listen, migrate) and the environment variables. cmd/facilitator's configdocs_test
// holds the table to the code, so holding the examples to the table holds them to the code.
type documentedConfig struct {
	flags, env map[string]bool
}

func readDocumentedConfig(t *testing.T) documentedConfig {
	t.Helper()
	doc := readRepoFile(t, "docs/configuration.md")
	_, section, ok := strings.Cut(doc, "\n## Flags and environment\n")
	if !ok {
		t.Fatal(`docs/configuration.md: no "## Flags and environment" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	c := documentedConfig{flags: map[string]bool{}, env: map[string]bool{}}
	flagRe := regexp.MustCompile("`--([a-z0-9-]+)`")
	envRe := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 4 {
			continue
		}
		for _, m := range flagRe.FindAllStringSubmatch(cells[1], -1) {
			c.flags[m[1]] = true
		}
		for _, m := range envRe.FindAllStringSubmatch(cells[2], -1) {
			c.env[m[1]] = true
		}
	}
	if !c.flags["listen"] || !c.env["FACILITATOR_LISTEN"] || !c.env["DATABASE_URL"] {
		t.Fatalf("docs/configuration.md: read flags %v and variables %v from the table, without listen, FACILITATOR_LISTEN or DATABASE_URL; has the table's layout changed?", c.flags, c.env)
	}
	return c
}

// serveImageName is the name deploy/README.md builds the Dockerfile's default target, the serve
// image, under (docker build -t NAME . without --target).
func serveImageName(t *testing.T) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^docker build -t (\S+) \.\s`)
	m := re.FindStringSubmatch(readRepoFile(t, "deploy/README.md"))
	if m == nil {
		t.Fatal("deploy/README.md: no `docker build -t NAME .` line for the serve image")
	}
	return m[1]
}

// intOrString is a Kubernetes port: a number or a port's name.
type intOrString string

func (s *intOrString) UnmarshalYAML(n *yaml.Node) error {
	*s = intOrString(n.Value)
	return nil
}

type k8sEnvVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef    *k8sKeyRef `yaml:"secretKeyRef"`
		ConfigMapKeyRef *k8sKeyRef `yaml:"configMapKeyRef"`
	} `yaml:"valueFrom"`
}

type k8sKeyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env     []k8sEnvVar `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Lifecycle struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
		RunAsUser                *int64 `yaml:"runAsUser"`
		ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type k8sVolume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode *int   `yaml:"defaultMode"`
		Items       []struct {
			Key  string `yaml:"key"`
			Path string `yaml:"path"`
			Mode *int   `yaml:"mode"`
		} `yaml:"items"`
	} `yaml:"secret"`
	EmptyDir *struct {
		Medium string `yaml:"medium"`
	} `yaml:"emptyDir"`
}

type k8sPodSpec struct {
	InitContainers                []k8sContainer `yaml:"initContainers"`
	Containers                    []k8sContainer `yaml:"containers"`
	Volumes                       []k8sVolume    `yaml:"volumes"`
	RestartPolicy                 string         `yaml:"restartPolicy"`
	TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool  `yaml:"runAsNonRoot"`
		RunAsUser    *int64 `yaml:"runAsUser"`
		FSGroup      *int64 `yaml:"fsGroup"`
	} `yaml:"securityContext"`
}

func (p *k8sPodSpec) volume(name string) *k8sVolume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

type k8sSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// k8sObject is one manifest: the fields of every kind the examples use (decoding is lenient:
// Kubernetes has far more fields than these checks read).
type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Resources  []string          `yaml:"resources"` // Kustomization
	Spec       struct {
		Replicas *int `yaml:"replicas"`
		Strategy struct {
			RollingUpdate *struct {
				MaxSurge intOrString `yaml:"maxSurge"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		// Deployment and PodDisruptionBudget: a label selector; Service: a plain map.
		Selector     yaml.Node `yaml:"selector"`
		MinAvailable *int      `yaml:"minAvailable"`
		Template     struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
		Ports []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

// selector is the object's spec.selector as labels: matchLabels, or a Service's plain map.
func (o *k8sObject) selector(t *testing.T) map[string]string {
	t.Helper()
	if o.Spec.Selector.Kind == 0 {
		return nil
	}
	if o.Kind == "Service" {
		var m map[string]string
		if err := o.Spec.Selector.Decode(&m); err != nil {
			t.Fatalf("%s: %s selector: %v", o.file, o.Kind, err)
		}
		return m
	}
	var s k8sSelector
	if err := o.Spec.Selector.Decode(&s); err != nil {
		t.Fatalf("%s: %s selector: %v", o.file, o.Kind, err)
	}
	return s.MatchLabels
}

const k8sDir = "deploy/kubernetes"

func loadManifests(t *testing.T) []*k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, k8sDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", k8sDir)
	}
	var out []*k8sObject
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			o := &k8sObject{file: filepath.Base(f)}
			err := dec.Decode(o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", o.file, err)
			}
			if o.Kind == "" || o.APIVersion == "" {
				t.Errorf("%s: a document without apiVersion or kind", o.file)
				continue
			}
			if o.Kind != "Kustomization" && o.Metadata.Name == "" {
				t.Errorf("%s: a %s without metadata.name", o.file, o.Kind)
			}
			out = append(out, o)
		}
	}
	return out
}

func findObject(objs []*k8sObject, kind, name string) *k8sObject {
	for _, o := range objs {
		if o.Kind == kind && (name == "" || o.Metadata.Name == name) {
			return o
		}
	}
	return nil
}

// podObjects are the manifests that run pods: the Deployment and the migration Job.
func podObjects(objs []*k8sObject) []*k8sObject {
	var out []*k8sObject
	for _, o := range objs {
		if o.Kind == "Deployment" || o.Kind == "Job" {
			out = append(out, o)
		}
	}
	return out
}

// isFacilitatorImage reports whether a container runs this repository's serve image.
func isFacilitatorImage(image, serveName string) bool {
	repo := image
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return path.Base(repo) == serveName
}

func isLabelSubset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetesManifests: the examples in deploy/kubernetes run the serve image with the
// documented configuration, probes on the port serve listens on, a non-root read-only
// container, and the signer keys at a mode serve accepts.
func TestKubernetesManifests(t *testing.T) {
	objs := loadManifests(t)
	cfg := readDocumentedConfig(t)
	serveName := serveImageName(t)
	commands := subcommands(t, "cmd/facilitator")

	dep := findObject(objs, "Deployment", "")
	if dep == nil {
		t.Fatal("no Deployment")
	}
	job := findObject(objs, "Job", "")
	if job == nil {
		t.Fatal("no Job (the migration)")
	}
	for _, kind := range []string{"Service", "PodDisruptionBudget", "ConfigMap", "Secret", "Kustomization"} {
		if findObject(objs, kind, "") == nil {
			t.Errorf("no %s", kind)
		}
	}

	// Every file kustomization.yaml lists exists.
	if k := findObject(objs, "Kustomization", ""); k != nil {
		for _, r := range k.Resources {
			if _, err := os.Stat(filepath.Join(root, k8sDir, r)); err != nil {
				t.Errorf("%s lists %s: %v", k.file, r, err)
			}
		}
	}

	for _, o := range podObjects(objs) {
		pod := &o.Spec.Template.Spec
		if sc := pod.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			t.Errorf("%s: %s %s: the pod should set runAsNonRoot and a non-zero runAsUser", o.file, o.Kind, o.Metadata.Name)
		}
		if !isLabelSubset(o.selector(t), o.Spec.Template.Metadata.Labels) && o.Kind == "Deployment" {
			t.Errorf("%s: the selector %v does not match the pod labels %v", o.file, o.selector(t), o.Spec.Template.Metadata.Labels)
		}
		for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			where := o.file + ": container " + c.Name
			if !imagePinned(c.Image) {
				t.Errorf("%s: image %q is not pinned to a tag (and latest does not count)", where, c.Image)
			}
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: readOnlyRootFilesystem should be true", where)
			}
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation should be false", where)
			}
			if sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				t.Errorf("%s: runs as root", where)
			}
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				t.Errorf("%s: want cpu and memory requests and a memory limit, got %+v", where, c.Resources)
			}
			for _, m := range c.VolumeMounts {
				if pod.volume(m.Name) == nil {
					t.Errorf("%s: mounts volume %s, which the pod does not declare", where, m.Name)
				}
			}
			if !isFacilitatorImage(c.Image, serveName) {
				continue
			}
			// The image's ENTRYPOINT is the binary: args name a subcommand, command stays unset.
			if len(c.Command) > 0 {
				t.Errorf("%s: command %q overrides the serve image's ENTRYPOINT (the binary); give args", where, c.Command)
			}
			if len(c.Args) == 0 || !slices.Contains(commands, c.Args[0]) {
				t.Errorf("%s: args %q do not start with a subcommand cmd/facilitator handles (%q)", where, c.Args, commands)
			}
			for _, a := range c.Args[1:] {
				if name, ok := strings.CutPrefix(a, "--"); ok {
					name, _, _ = strings.Cut(name, "=")
					if !cfg.flags[name] {
						t.Errorf("%s: flag --%s is not in docs/configuration.md", where, name)
					}
				}
			}
			for _, name := range containerEnvNames(t, objs, o.file, c) {
				if !cfg.env[name] {
					t.Errorf("%s: environment variable %s is not in docs/configuration.md's table", where, name)
				}
			}
		}
	}

	// The Deployment: serve, with probes on its listen port and the keys at 0400.
	var serve *k8sContainer
	for i, c := range dep.Spec.Template.Spec.Containers {
		if isFacilitatorImage(c.Image, serveName) {
			serve = &dep.Spec.Template.Spec.Containers[i]
		}
	}
	if serve == nil {
		t.Fatalf("%s: no container runs the serve image %s (deploy/README.md's docker build -t)", dep.file, serveName)
	}
	if len(serve.Args) > 0 && serve.Args[0] != "serve" {
		t.Errorf("%s: the Deployment runs %q, want serve", dep.file, serve.Args)
	}
	// The grace period runs from before preStop: what serve gets after SIGTERM is the rest.
	preStop := 0
	if p := serve.Lifecycle.PreStop; p != nil && p.Sleep != nil {
		preStop = p.Sleep.Seconds
	}
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g-preStop)*time.Second < minDrain {
		t.Errorf("%s: terminationGracePeriodSeconds, less preStop's %d s, should be at least %s (SIGTERM drains serve; the default is 30 s)", dep.file, preStop, minDrain)
	}
	env := containerEnv(t, objs, dep.file, *serve)
	listen, ok := env["FACILITATOR_LISTEN"]
	if !ok {
		listen = "127.0.0.1:4021"
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("%s: FACILITATOR_LISTEN %q: %v", dep.file, listen, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		t.Errorf("%s: serve listens on %s, unreachable by the kubelet's probes and the Service", dep.file, listen)
	}
	portNum, _ := strconv.Atoi(port)
	resolve := func(p intOrString) int {
		if n, err := strconv.Atoi(string(p)); err == nil {
			return n
		}
		for _, cp := range serve.Ports {
			if cp.Name == string(p) {
				return cp.ContainerPort
			}
		}
		return -1
	}
	if !slices.ContainsFunc(serve.Ports, func(p struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	}) bool {
		return p.ContainerPort == portNum
	}) {
		t.Errorf("%s: serve listens on port %s, which is not a containerPort", dep.file, port)
	}
	for _, p := range []struct {
		name, path string
		probe      *k8sProbe
	}{
		{"livenessProbe", "/healthz", serve.LivenessProbe},
		{"readinessProbe", "/readyz", serve.ReadinessProbe},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no %s with httpGet", dep.file, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s: %s asks %s, want %s", dep.file, p.name, p.probe.HTTPGet.Path, p.path)
		}
		if got := resolve(p.probe.HTTPGet.Port); got != portNum {
			t.Errorf("%s: %s asks port %s (%d), serve listens on %d", dep.file, p.name, p.probe.HTTPGet.Port, got, portNum)
		}
	}
	if p := serve.StartupProbe; p != nil && (p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || resolve(p.HTTPGet.Port) != portNum) {
		t.Errorf("%s: the startupProbe should ask /healthz on port %d", dep.file, portNum)
	}
	if !strings.Contains(commandSource(t, "api"), `"/healthz"`) || !strings.Contains(commandSource(t, "api"), `"/readyz"`) {
		t.Error(`api/ routes neither "/healthz" nor "/readyz" any more; the probes ask them`)
	}

	// The Service and the PDB select serve's pods and not the migration's.
	podLabels := dep.Spec.Template.Metadata.Labels
	for _, kind := range []string{"Service", "PodDisruptionBudget"} {
		o := findObject(objs, kind, "")
		if o == nil {
			continue
		}
		sel := o.selector(t)
		if !isLabelSubset(sel, podLabels) {
			t.Errorf("%s: the %s's selector %v does not select the Deployment's pods %v", o.file, kind, sel, podLabels)
		}
		if isLabelSubset(sel, job.Spec.Template.Metadata.Labels) {
			t.Errorf("%s: the %s's selector %v also selects the migration Job's pods", o.file, kind, sel)
		}
		if kind == "Service" {
			for _, p := range o.Spec.Ports {
				if got := resolve(p.TargetPort); got != portNum {
					t.Errorf("%s: targetPort %s (%d) is not serve's port %d", o.file, p.TargetPort, got, portNum)
				}
			}
		}
	}
	if pdb := findObject(objs, "PodDisruptionBudget", ""); pdb != nil && dep.Spec.Replicas != nil && pdb.Spec.MinAvailable != nil && *pdb.Spec.MinAvailable >= *dep.Spec.Replicas {
		t.Errorf("%s: minAvailable %d with %d replicas blocks every node drain", pdb.file, *pdb.Spec.MinAvailable, *dep.Spec.Replicas)
	}

	// The migration Job runs migrate, once, with the database it needs.
	var migrate *k8sContainer
	for i, c := range job.Spec.Template.Spec.Containers {
		if isFacilitatorImage(c.Image, serveName) {
			migrate = &job.Spec.Template.Spec.Containers[i]
		}
	}
	if migrate == nil || len(migrate.Args) == 0 || migrate.Args[0] != "migrate" {
		t.Errorf("%s: the Job should run the serve image with args [migrate]", job.file)
	} else {
		if _, ok := containerEnv(t, objs, job.file, *migrate)["DATABASE_URL"]; !ok {
			t.Errorf("%s: migrate has no DATABASE_URL", job.file)
		}
		if migrate.Image != serve.Image {
			t.Errorf("%s: migrates with %s but the Deployment serves %s: the migrations are the binary's", job.file, migrate.Image, serve.Image)
		}
	}
	if rp := job.Spec.Template.Spec.RestartPolicy; rp != "Never" && rp != "OnFailure" {
		t.Errorf("%s: a Job's restartPolicy must be Never or OnFailure, got %q", job.file, rp)
	}

	checkSignerKeysMount(t, dep, *serve, env)
	checkReplicasAgainstKeys(t, objs, dep)
}

// checkSignerKeysMount: every Secret volume is 0400 or 0600, and the keys file serve reads is
// one it accepts (its own, open to no group or others). A Secret's files are root's, and fsGroup
// turns 0400 into 0440: so serve reads a Secret directly only without fsGroup (and as root), or
// a copy an init container made with mode 0400.
func checkSignerKeysMount(t *testing.T, dep *k8sObject, serve k8sContainer, env map[string]string) {
	t.Helper()
	pod := &dep.Spec.Template.Spec
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		modes := []*int{v.Secret.DefaultMode}
		for _, it := range v.Secret.Items {
			if it.Mode != nil {
				modes = append(modes, it.Mode)
			}
		}
		for _, m := range modes {
			if m == nil || (*m != 0o400 && *m != 0o600) {
				t.Errorf("%s: Secret volume %s has mode %s; serve refuses a keys file open to group or others (want 0400 or 0600; the default is 0644)", dep.file, v.Name, octal(m))
			}
		}
	}
	keysFile, ok := env["FACILITATOR_SIGNER_KEYS_FILE"]
	if !ok {
		t.Errorf("%s: serve has no FACILITATOR_SIGNER_KEYS_FILE", dep.file)
		return
	}
	mount := ""
	for _, m := range serve.VolumeMounts {
		if strings.HasPrefix(keysFile, strings.TrimSuffix(m.MountPath, "/")+"/") {
			mount = m.Name
			if !m.ReadOnly {
				t.Errorf("%s: the keys volume %s is mounted writable", dep.file, m.Name)
			}
		}
	}
	v := pod.volume(mount)
	switch {
	case v == nil:
		t.Errorf("%s: FACILITATOR_SIGNER_KEYS_FILE %s is under no volume serve mounts", dep.file, keysFile)
	case v.Secret != nil:
		if pod.SecurityContext.FSGroup != nil {
			t.Errorf("%s: serve reads the keys straight from Secret volume %s, but fsGroup makes its files 0440, which serve refuses", dep.file, v.Name)
		}
	case v.EmptyDir != nil:
		if v.EmptyDir.Medium != "Memory" {
			t.Errorf("%s: the keys' copy in %s should be in memory (medium: Memory), not on the node's disk", dep.file, v.Name)
		}
		copied := false
		for _, ic := range pod.InitContainers {
			cmd := strings.Join(append(slices.Clone(ic.Command), ic.Args...), " ")
			writes := slices.ContainsFunc(ic.VolumeMounts, func(m struct {
				Name      string `yaml:"name"`
				MountPath string `yaml:"mountPath"`
				ReadOnly  bool   `yaml:"readOnly"`
			}) bool {
				return m.Name == v.Name && !m.ReadOnly
			})
			if writes && regexp.MustCompile(`-m 0?[46]00\b|chmod 0?[46]00\b`).MatchString(cmd) {
				copied = true
			}
		}
		if !copied {
			t.Errorf("%s: the keys volume %s is an emptyDir no init container writes with mode 0400 or 0600", dep.file, v.Name)
		}
	default:
		t.Errorf("%s: the keys volume %s is neither a Secret nor an emptyDir", dep.file, v.Name)
	}
}

// checkReplicasAgainstKeys: a replica without a signer key answers new payments with 503 while
// it stays ready, so the example's replicas should not outnumber the example's keys.
func checkReplicasAgainstKeys(t *testing.T, objs []*k8sObject, dep *k8sObject) {
	t.Helper()
	if dep.Spec.Replicas == nil {
		return
	}
	// A rolling update runs replicas plus maxSurge pods at once (the default surge is 25%,
	// at least one).
	pods := *dep.Spec.Replicas + 1
	if ru := dep.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != "" {
		if n, err := strconv.Atoi(string(ru.MaxSurge)); err == nil {
			pods = *dep.Spec.Replicas + n
		}
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		s := findObject(objs, "Secret", v.Secret.SecretName)
		if s == nil {
			t.Errorf("%s: volume %s mounts Secret %s, which no example defines", dep.file, v.Name, v.Secret.SecretName)
			continue
		}
		for _, keys := range s.StringData {
			n := 0
			for _, l := range strings.Split(keys, "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					n++
				}
			}
			if n < pods {
				t.Errorf("%s: up to %d pods (replicas and maxSurge) but %s holds %d signer key(s): a replica without a key answers payments with 503", dep.file, pods, s.file, n)
			}
		}
	}
}

func octal(m *int) string {
	if m == nil {
		return "unset"
	}
	return "0" + strconv.FormatInt(int64(*m), 8)
}

// containerEnv is a container's environment as the kubelet builds it: envFrom first, then env,
// with references resolved against the examples' ConfigMaps and Secrets.
func containerEnv(t *testing.T, objs []*k8sObject, file string, c k8sContainer) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm := findObject(objs, "ConfigMap", ef.ConfigMapRef.Name)
			if cm == nil {
				t.Errorf("%s: container %s: envFrom ConfigMap %s is not defined", file, c.Name, ef.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				out[k] = v
			}
		case ef.SecretRef != nil:
			s := findObject(objs, "Secret", ef.SecretRef.Name)
			if s == nil {
				t.Errorf("%s: container %s: envFrom Secret %s is not defined", file, c.Name, ef.SecretRef.Name)
				continue
			}
			for k, v := range s.StringData {
				out[k] = v
			}
		}
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			for kind, ref := range map[string]*k8sKeyRef{"Secret": e.ValueFrom.SecretKeyRef, "ConfigMap": e.ValueFrom.ConfigMapKeyRef} {
				if ref == nil {
					continue
				}
				o := findObject(objs, kind, ref.Name)
				if o == nil {
					t.Errorf("%s: container %s: %s takes %s %s, which no example defines", file, c.Name, e.Name, kind, ref.Name)
					continue
				}
				data := o.Data
				if kind == "Secret" {
					data = o.StringData
				}
				val, ok := data[ref.Key]
				if !ok {
					t.Errorf("%s: container %s: %s takes key %s of %s %s, which has no such key", file, c.Name, e.Name, ref.Key, kind, ref.Name)
				}
				v = val
			}
		}
		out[e.Name] = v
	}
	return out
}

func containerEnvNames(t *testing.T, objs []*k8sObject, file string, c k8sContainer) []string {
	t.Helper()
	var names []string
	for k := range containerEnv(t, objs, file, c) {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// TestKustomizeBuild renders kustomization.yaml with kubectl's kustomize, where kubectl is
// installed: the files it lists parse as Kubernetes objects and build together.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: kustomization.yaml is checked by TestKubernetesManifests alone")
	}
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(root, k8sDir)).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", k8sDir, err, out)
	}
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} {
		if !regexp.MustCompile(`(?m)^kind: ` + kind + `$`).Match(out) {
			t.Errorf("kubectl kustomize %s renders no %s", k8sDir, kind)
		}
	}
}
