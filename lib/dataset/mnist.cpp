// Built from lib/meson.build; the MNIST reader.
