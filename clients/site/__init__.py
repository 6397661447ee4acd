"""What a site keeps between rounds: state store, decoded-data cache, atomic files."""
