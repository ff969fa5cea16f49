module github.com/cocoonrt/cocoon/integration/critest

go 1.26.8

require github.com/google/go-containerregistry v0.22.1
