"""Where perfmon's numbers go besides its own screens: Prometheus and trace files."""
