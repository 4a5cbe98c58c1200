from specfmt.cli import main

main()
