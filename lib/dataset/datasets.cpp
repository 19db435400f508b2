// Built from lib/meson.build; filled in by the datasets of issue 3.
