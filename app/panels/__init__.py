"""The page's panels, one module each: its components, its values from a comparison, its wiring.
`app.ui` lays them out and wires the Run event."""
