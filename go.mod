module github.com/ursula-go/ursula

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0 // indirect
	github.com/klauspost/cpuid/v2 v2.0.9 // indirect
	lukechampine.com/blake3 v1.4.1 // indirect
)
