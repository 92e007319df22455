package client

import (
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// proxyFromEnv picks the outbound proxy of each request from HTTPS_PROXY (https URLs),
// HTTP_PROXY (http URLs) and ALL_PROXY (either, when the scheme's own is unset), in
// upper or lower case, read once when the transport is made. NO_PROXY lists hosts that
// go direct: "*" for all, a name (which also covers its subdomains; a leading dot is
// allowed), an IP address or a CIDR block, each optionally with ":port". Loopback hosts
// always go direct: a proxy cannot reach this machine's own servers. Unlike
// http.ProxyFromEnvironment, which reads the environment once per process, every new
// transport sees the environment as it is then.
func proxyFromEnv() func(*http.Request) (*url.URL, error) {
	get := func(name string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return os.Getenv(strings.ToLower(name))
	}
	all := get("ALL_PROXY")
	byScheme := map[string]string{"https": get("HTTPS_PROXY"), "http": get("HTTP_PROXY")}
	noProxy := strings.Split(get("NO_PROXY"), ",")
	return func(req *http.Request) (*url.URL, error) {
		raw := byScheme[req.URL.Scheme]
		if raw == "" {
			raw = all
		}
		if raw == "" || bypassProxy(req.URL, noProxy) {
			return nil, nil
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			// A bare host:port names an http proxy.
			if u, err = url.Parse("http://" + raw); err != nil {
				return nil, err
			}
		}
		return u, nil
	}
}

// bypassProxy reports whether the request to u goes direct under the NO_PROXY entries.
func bypassProxy(u *url.URL, noProxy []string) bool {
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	if ip != nil && ip.IsLoopback() {
		return true
	}
	for _, e := range noProxy {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		if e == "*" {
			return true
		}
		if _, cidr, err := net.ParseCIDR(e); err == nil {
			if ip != nil && cidr.Contains(ip) {
				return true
			}
			continue
		}
		if h, p, err := net.SplitHostPort(e); err == nil {
			if p != port {
				continue
			}
			e = h
		}
		e = strings.Trim(e, "[]")
		if eip := net.ParseIP(e); eip != nil {
			if ip != nil && eip.Equal(ip) {
				return true
			}
			continue
		}
		e = strings.TrimPrefix(strings.TrimPrefix(e, "*"), ".")
		if host == e || strings.HasSuffix(host, "."+e) {
			return true
		}
	}
	return false
}
