"""Everything a person looks at: neuron-ls, neuron-top, the profile TUI and the GUI."""
