// Built from lib/meson.build; filled in by the samplers of issue 3.
